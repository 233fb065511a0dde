#!/usr/bin/env python3
"""Keeps the docs and the code saying the same thing (CTest docs_check, label docs).

Fails, naming FILE:LINE and what to do, when
  (a) a cited markdown anchor (docs/DESIGN.md#modules, DESIGN.md#data-flow, a markdown link's
      `(#anchor)`) anywhere in the tree names a file or an anchor that does not exist (anchors
      are GitHub's heading slugs and explicit <a id="..."> tags), or a paragraph it names in
      quotes after the anchor (`#data-flow, "Routes"`) is not a bold lead or a heading of
      that section;
  (b) a fenced ```sh / ```bash block of README.md, docs/*.md or python/README.md does not parse
      (bash -n);
  (c) a `path/file.c:function` or `file.c:function` reference in README.md, docs/*.md,
      python/README.md or CONTRIBUTING.md names a file the tree lacks, or a function the file
      does not hold;
  (d) an environment variable the product reads (core/, backends/, collectives/, tools/,
      python/shardload/; tests excluded) is missing from docs/ENVIRONMENT.md's tables, or a
      variable in those tables is read nowhere in the tree;
  (e) a repository path in backticks in README.md or docs/*.md (a path with a / and an
      extension whose first component is a top-level entry, or a top-level file's name), or a
      relative markdown link's target there, does not exist.
Files are found by walking the tree (never a list of names), so a file that moves or is renamed
is found where it is now. Python 3 standard library only.

Usage: check_docs.py [--root DIR]   (default: the repository holding this script)
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

SKIP_DIRS = {".git", ".gpu", "__pycache__", "node_modules", ".venv", "venv", "results"}
TOP_FILES = {"README.md", "CONTRIBUTING.md", "CMakeLists.txt", "CMakePresets.json", "pyproject.toml",
             ".clang-format", ".editorconfig"}
CODE_EXT = (".c", ".h", ".cc", ".cpp", ".cu", ".cl", ".hip", ".py", ".sh")
PRODUCT_DIRS = ("core", "backends", "collectives", "tools", "python/shardload")
ENV_DOC = "docs/ENVIRONMENT.md"
# an environment variable's name: upper case, or with an underscore (OMPI_MCA_ess_base_jobid)
ENV_NAME = r"(?:[A-Z][A-Za-z0-9]*_[A-Za-z0-9_]+|[A-Z][A-Z0-9]{2,})"


class Checker:
    def __init__(self, root):
        self.root = os.path.abspath(root)
        self.findings = []
        self.files = []  # every file of the tree, relative, '/'-separated
        for d, dirs, names in os.walk(self.root):
            rel = os.path.relpath(d, self.root)
            dirs[:] = sorted(x for x in dirs
                             if x not in SKIP_DIRS and not x.startswith("build")
                             and not (rel == "." and x.startswith(".") and x != ".ci"))
            for n in sorted(names):
                self.files.append(os.path.normpath(os.path.join(rel, n)).replace(os.sep, "/"))
        self.fileset = set(self.files)
        self.top = {f.split("/")[0] for f in self.files}
        self._text = {}
        self._anchors = {}

    # ---- helpers ----------------------------------------------------------------------------
    def text(self, rel):
        if rel not in self._text:
            try:
                path = os.path.join(self.root, rel)
                if os.path.getsize(path) > 4 << 20:
                    raise ValueError("too large")
                with open(path, encoding="utf-8") as f:
                    self._text[rel] = f.read()
            except (OSError, UnicodeDecodeError, ValueError):
                self._text[rel] = None
        return self._text[rel]

    def fail(self, rel, line, kind, msg):
        f = f"{rel}:{line}: [{kind}] {msg}"
        if f not in self.findings:  # a markdown link may show the anchor it cites: [x](x), once
            self.findings.append(f)

    def docs(self, extra=()):
        out = [f for f in ("README.md",) + tuple(extra) if f in self.fileset]
        out += sorted(f for f in self.files if re.fullmatch(r"docs/[^/]+\.md", f))
        return out

    @staticmethod
    def line_of(text, pos):
        return text.count("\n", 0, pos) + 1

    def exists(self, rel):
        rel = os.path.normpath(rel).replace(os.sep, "/")
        return rel in self.fileset or any(f.startswith(rel.rstrip("/") + "/") for f in self.files)

    def by_suffix(self, path):
        """Tree files whose path is PATH or ends with /PATH (a bare name: any directory)."""
        path = path.strip("/")
        if path in self.fileset:
            return [path]
        return [f for f in self.files if f.endswith("/" + path)]

    # ---- (a) anchors ------------------------------------------------------------------------
    @staticmethod
    def slug(heading):
        t = re.sub(r"<[^>]+>", "", heading)                 # inline HTML (<a id=...></a>)
        t = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", t)    # links keep their text
        t = t.strip().lower()
        t = re.sub(r"[^\w\- ]", "", t)                     # GitHub drops punctuation
        return t.replace(" ", "-")

    def anchors(self, rel):
        if rel not in self._anchors:
            text = self.text(rel) or ""
            got, seen, fence = set(), {}, False
            for line in text.split("\n"):
                if re.match(r"\s*```", line):
                    fence = not fence
                    continue
                if fence:
                    continue
                got.update(re.findall(r"<a\s+(?:id|name)=\"([^\"]+)\"", line))
                m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
                if m:
                    s = self.slug(m.group(1))
                    n = seen.get(s, 0)
                    seen[s] = n + 1
                    got.add(s if n == 0 else f"{s}-{n}")
            self._anchors[rel] = got
        return self._anchors[rel]

    def section(self, rel, anchor):
        """The text of REL's section ANCHOR (its heading to the next heading of its level or
        above), or None."""
        lines, start, level = (self.text(rel) or "").split("\n"), None, 0
        seen, fence = {}, False
        for i, line in enumerate(lines):
            if re.match(r"\s*```", line):
                fence = not fence
            m = None if fence else re.match(r"(#{1,6})\s+(.*?)\s*#*\s*$", line)
            if not m:
                continue
            if start is not None and len(m.group(1)) <= level:
                return "\n".join(lines[start:i])
            s = self.slug(m.group(2))
            n = seen.get(s, 0)
            seen[s] = n + 1
            ids = set(re.findall(r"<a\s+(?:id|name)=\"([^\"]+)\"", line)) | {s if n == 0 else f"{s}-{n}"}
            if start is None and anchor in ids:
                start, level = i, len(m.group(1))
        return "\n".join(lines[start:]) if start is not None else None

    def resolve_md(self, citing, target):
        for cand in (os.path.join(os.path.dirname(citing), target), target, os.path.join("docs", target)):
            cand = os.path.normpath(cand).replace(os.sep, "/")
            if cand in self.fileset:
                return cand
        return None

    def check_anchors(self):
        cite = re.compile(r"(?<![\w./-])((?:[\w.-]+/)*[\w.-]+\.md)#([\w-]+)")
        local = re.compile(r"\]\(#([\w-]+)\)")
        for rel in self.files:
            text = self.text(rel)
            if not text or ".md#" not in text and "](#" not in text:
                continue
            for m in cite.finditer(text):
                start = text.rfind(" ", 0, m.start()) + 1
                if "://" in text[start:m.start()]:
                    continue  # a URL: another site's anchor
                target, anchor = m.group(1), m.group(2)
                line = self.line_of(text, m.start())
                md = self.resolve_md(rel, target)
                if not md:
                    self.fail(rel, line, "anchor", f"{target}#{anchor}: no file {target} (from {rel}'s directory, "
                              "the root or docs/); cite the file that holds the section")
                elif anchor not in self.anchors(md):
                    self.fail(rel, line, "anchor", f"{target}#{anchor}: {md} has no heading or <a id> '{anchor}'; "
                              "cite one of its sections (a GitHub heading slug or an <a id=...>) or add it")
                else:
                    # a paragraph named after the anchor: docs/DESIGN.md#data-flow, "Two planes"
                    named = re.match(r"[,:]?\s*\"([^\"\n]{3,60})\"", text[m.end():])
                    if named:
                        sect = self.section(md, anchor) or ""
                        title = named.group(1)
                        if f"**{title}" not in sect and not re.search(rf"^#+ .*{re.escape(title)}", sect, re.M):
                            self.fail(rel, line, "anchor", f"{target}#{anchor}, \"{title}\": {md}'s section "
                                      f"'{anchor}' has no paragraph or heading \"{title}\"; cite the section "
                                      "that holds it")
            if rel.endswith(".md"):
                for m in local.finditer(text):
                    if m.group(1) not in self.anchors(rel):
                        self.fail(rel, self.line_of(text, m.start()), "anchor",
                                  f"(#{m.group(1)}): {rel} has no heading or <a id> '{m.group(1)}'; link to a "
                                  "section it has, or to the file that now holds it (its name, then #anchor)")

    # ---- (b) shell blocks -------------------------------------------------------------------
    def check_shell(self):
        for rel in self.docs(("python/README.md",)):
            lines = (self.text(rel) or "").split("\n")
            i = 0
            while i < len(lines):
                m = re.match(r"(\s*)```(sh|bash)\s*$", lines[i])
                if not m:
                    i += 1
                    continue
                indent, start, body = len(m.group(1)), i + 1, []
                i += 1
                while i < len(lines) and not re.match(r"\s*```\s*$", lines[i]):
                    body.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i])
                    i += 1
                i += 1
                with tempfile.NamedTemporaryFile("w", suffix=".sh", delete=False) as f:
                    f.write("\n".join(body) + "\n")
                try:
                    r = subprocess.run(["bash", "-n", f.name], capture_output=True, text=True)
                finally:
                    os.unlink(f.name)
                if r.returncode != 0:
                    err = r.stderr.strip().replace(f.name + ": ", "").split("\n")[0]
                    n = re.search(r"line (\d+)", err)
                    line = start + int(n.group(1)) if n else start
                    self.fail(rel, line, "sh", f"the ```{m.group(2)} block at line {start} does not parse "
                              f"(bash -n: {err}); fix the command, or fence it as text if it is not one")

    # ---- (c) file:function references ---------------------------------------------------------
    @staticmethod
    def holds(text, ext, fn):
        if ext == ".py":
            return re.search(rf"^\s*(?:async\s+)?(?:def|class)\s+{fn}\b|^{fn}\s*=", text, re.M) is not None
        if ext == ".sh":
            return re.search(rf"^\s*(?:function\s+)?{fn}\s*\(\s*\)", text, re.M) is not None
        return re.search(rf"\b{fn}\s*\(|#\s*define\s+{fn}\b", text) is not None

    def check_functions(self):
        ref = re.compile(r"(?<![\w./-])((?:[\w.-]+/)*[\w.-]+(\.(?:c|h|cc|cpp|cu|cl|py|sh))):([A-Za-z_]\w*)")
        for rel in self.docs(("python/README.md", "CONTRIBUTING.md")):
            text = self.text(rel) or ""
            for m in ref.finditer(text):
                path, ext, fn = m.group(1), m.group(2), m.group(3)
                line = self.line_of(text, m.start())
                found = self.by_suffix(path)
                if not found:
                    self.fail(rel, line, "function", f"{path}:{fn}: no file {path} in the tree; name the file "
                              f"that holds {fn} now (grep -rn '{fn}' --include='*{ext}')")
                elif not any(self.holds(self.text(f) or "", ext, fn) for f in found):
                    self.fail(rel, line, "function", f"{path}:{fn}: {', '.join(found)} has no function {fn}; "
                              "name the function as the code spells it, or the file it moved to")

    # ---- (d) environment variables ------------------------------------------------------------
    def env_reads(self, rel):
        """(name, line) of each environment variable REL reads."""
        text = self.text(rel) or ""
        out, var = [], ENV_NAME

        def add(name, pos):
            out.append((name, self.line_of(text, pos)))

        for m in re.finditer(rf"\b(?:secure_)?getenv\s*\(\s*[\"']({var})[\"']", text):
            add(m.group(1), m.start())
        # a helper of the file that reads the variable it is given: env_int(ctx, "RANK", ...)
        for m in re.finditer(r"\b(\w*env\w*)\s*\(", text, re.I):
            if m.group(1).lower() in ("setenv", "unsetenv", "putenv", "clearenv") or m.group(1).startswith("def"):
                continue
            depth, j = 1, m.end()
            while j < len(text) and depth and j - m.end() < 600:
                depth += {"(": 1, ")": -1}.get(text[j], 0)
                j += 1
            for a in re.finditer(rf"[\"']({var})[\"']", text[m.end():j]):
                add(a.group(1), m.end() + a.start())
        # a name kept in a constant: #define SL_GPU_SYNC_TIMEOUT_ENV "...", _ENV = "..."
        for m in re.finditer(rf"^\s*#\s*define\s+\w*ENV\w*\s+\"({var})\"", text, re.M):
            add(m.group(1), m.start())
        for m in re.finditer(rf"^\s*_?[A-Z0-9_]*ENV[A-Z0-9_]*\s*=\s*[\"']({var})[\"']", text, re.M):
            add(m.group(1), m.start())
        # names in an array the file hands getenv: vars[] = {"A", "B"} ... getenv(vars[i])
        for m in re.finditer(r"(\w+)\s*\[\s*\]\s*=\s*\{([^}]*)\}", text):
            if re.search(rf"getenv\s*\(\s*{m.group(1)}\s*\[", text):
                for a in re.finditer(rf"\"({var})\"", m.group(2)):
                    add(a.group(1), m.start(2) + a.start())
        # Python: os.environ["X"] (not assigned), os.environ.get("X"), "X" in os.environ
        for m in re.finditer(rf"environ(?:\.get|\.pop|\.setdefault)?\s*[\[(]\s*[\"']({var})[\"']\s*(\]\s*=(?!=))?",
                             text):
            if not m.group(2):
                add(m.group(1), m.start())
        for m in re.finditer(rf"[\"']({var})[\"']\s+(?:not\s+)?in\s+(?:os\.)?environ\b", text):
            add(m.group(1), m.start())
        if rel.endswith(".sh") or rel.startswith(".ci/"):
            for m in re.finditer(rf"\$\{{?({var})\b", text):
                add(m.group(1), m.start())
        return out

    @staticmethod
    def is_product(rel):
        if not rel.startswith(tuple(d + "/" for d in PRODUCT_DIRS)) or not rel.endswith(CODE_EXT):
            return False
        base = os.path.basename(rel)
        if rel.startswith("tools/") and not rel.endswith((".c", ".h")):
            return False  # the command is C; tools/*.py are the tests' helpers (crosscheck_dtype.py)
        return not (base.startswith("test_") or "/tests/" in rel or base.endswith("_test.c"))

    def check_env(self):
        product, anywhere = {}, set()
        for rel in self.files:
            if not (rel.endswith(CODE_EXT) or rel.startswith((".ci/", "scripts/"))):
                continue
            for name, line in self.env_reads(rel):
                anywhere.add(name)
                if self.is_product(rel):
                    product.setdefault(name, (rel, line))
        if ENV_DOC not in self.fileset:
            self.fail(ENV_DOC, 1, "env", f"missing; the product reads {len(product)} variables "
                      f"({', '.join(sorted(product)[:5])}, ...): write the table (variable, who reads it, what it "
                      "does, its default)")
            return
        table, hooks, in_hooks = {}, set(), False
        for i, line in enumerate(self.text(ENV_DOC).split("\n"), 1):
            if line.startswith("#"):
                in_hooks = "test hook" in line.lower()
            if line.startswith("|") and not re.match(r"\|\s*-", line):
                first = line.split("|")[1]
                for name in re.findall(rf"`({ENV_NAME})(?:=[^`]*)?`", first):
                    table.setdefault(name, i)
                    if in_hooks:
                        hooks.add(name)
        for name, (rel, line) in sorted(product.items()):
            if name not in table:
                self.fail(rel, line, "env", f"{name} is read here but is not in {ENV_DOC}; add a row: who reads "
                          "it, what it does, its default")
            elif name in hooks:
                self.fail(rel, line, "env", f"{name} is a test hook ({ENV_DOC}:{table[name]}) but the shipped "
                          "code reads it here; read it in the tests' build of the command (tests/cli_hooks.c), "
                          "or move its row out of the test hooks")
        for name, line in sorted(table.items(), key=lambda x: x[1]):
            if name not in anywhere:
                self.fail(ENV_DOC, line, "env", f"{name} is in the table but nothing in the tree reads it; remove "
                          "the row, or name the variable as the code spells it")

    # ---- (e) paths in backticks --------------------------------------------------------------
    def check_paths(self):
        for rel in self.docs():
            fence = False
            for i, line in enumerate((self.text(rel) or "").split("\n"), 1):
                if re.match(r"\s*```", line):
                    fence = not fence
                    continue
                if fence:
                    continue
                for m in re.finditer(r"\]\(([^)\s#]+)(?:#[^)]*)?\)", line):  # a relative link's target
                    target = m.group(1)
                    if "://" in target or target.startswith(("mailto:", "/")):
                        continue
                    cand = os.path.normpath(os.path.join(os.path.dirname(rel), target)).replace(os.sep, "/")
                    if not self.exists(cand):
                        self.fail(rel, i, "path", f"link ({target}): no {cand} in the tree; link to the file as "
                                  f"it is now, relative to {os.path.dirname(rel) or 'the root'}")
                for m in re.finditer(r"`([^`\s]+)`", line):
                    p = re.sub(r":[A-Za-z_]\w*$", "", m.group(1))  # file.c:function is (c)'s
                    p = p.split("#")[0]
                    if p in TOP_FILES:
                        if p not in self.fileset:
                            self.fail(rel, i, "path", f"`{p}` does not exist at the top of the tree; fix the "
                                      "name or drop the reference")
                        continue
                    if ("/" not in p or not re.search(r"\.[A-Za-z0-9]+/?$", p) or re.search(r"[<>$*{}~=]|://", p)
                            or p.startswith(("/", "./", "../"))):
                        continue
                    if p.split("/")[0] not in self.top or re.search(r"(^|/)[A-Z_]+(/|$)", p):
                        continue  # not a repository path (an installed or a placeholder path)
                    if not self.exists(p) and not self.by_suffix(p):
                        self.fail(rel, i, "path", f"`{p}` does not exist; name the file as it is now in the tree, "
                                  "or drop the reference")

    def run(self):
        self.check_anchors()
        self.check_shell()
        self.check_functions()
        self.check_env()
        self.check_paths()
        return self.findings


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    args = ap.parse_args(argv)
    findings = Checker(args.root).run()
    for f in findings:
        print(f)
    if findings:
        print(f"check_docs: {len(findings)} finding(s): the docs and the code disagree (see above)")
        return 1
    print("check_docs: the docs and the code agree (anchors, sh blocks, file:function references, "
          "environment variables, paths)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
