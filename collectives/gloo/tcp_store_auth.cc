// The tcp:// rendezvous's job secret: the token from SHARDLOAD_TOKEN or SHARDLOAD_TOKEN_FILE,
// whether a rendezvous may run without one, the key derived from it and the handshake's HMAC
// proofs (libsodium). Declarations: tcp_store_auth.h; the handshake: tcp_store.h.
#include "tcp_store_auth.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sodium.h>

#include "tcp_store_wire.h"

namespace shardload {
namespace {

using tcp_store_wire::kProtocol;
using tcp_store_wire::put_u32;

// What a proof covers: the protocol, who proves (ROLE 'S' the server, 'C' the client), the
// rank and world size the client claims, and both nonces.
std::string transcript(char role, long rank, long world, const std::string &cn, const std::string &sn) {
  std::string t = std::string("shardload-rdzv/") + kProtocol;
  t += role;
  put_u32(t, uint32_t(rank));
  put_u32(t, uint32_t(world));
  return t + cn + sn;
}

const char kTokenAdvice[] =
    "set the same secret of 16 or more characters on every rank: export SHARDLOAD_TOKEN before torchrun "
    "(it passes the environment on to the ranks) or in the Slurm batch script before srun (which propagates "
    "the environment), or put it in a file only you can read (chmod 600) on a filesystem every node shares "
    "and set SHARDLOAD_TOKEN_FILE to its path; shardload load --nproc makes one itself";

} // namespace

namespace tcp_store_auth {

std::string random_nonce() {
  std::string n(kNonce, '\0');
  randombytes_buf(&n[0], n.size());
  return n;
}

// HMAC-SHA-256 of the transcript under KEY.
std::string proof(const TcpStoreKey &key, char role, long rank, long world, const std::string &cn,
                  const std::string &sn) {
  std::string t = transcript(role, rank, world, cn, sn);
  std::string mac(crypto_auth_hmacsha256_BYTES, '\0');
  crypto_auth_hmacsha256(reinterpret_cast<unsigned char *>(&mac[0]), reinterpret_cast<const unsigned char *>(t.data()),
                         t.size(), key.data());
  return mac;
}

// Constant time (crypto_auth_hmacsha256_verify recomputes and compares with a constant-time
// comparison); a proof of the wrong length is simply wrong.
bool proof_ok(const TcpStoreKey &key, const std::string &mac, char role, long rank, long world,
              const std::string &cn, const std::string &sn) {
  if (mac.size() != crypto_auth_hmacsha256_BYTES) return false;
  std::string t = transcript(role, rank, world, cn, sn);
  return crypto_auth_hmacsha256_verify(reinterpret_cast<const unsigned char *>(mac.data()),
                                       reinterpret_cast<const unsigned char *>(t.data()), t.size(), key.data()) == 0;
}

void need_sodium() {
  if (sodium_init() < 0) throw std::runtime_error("libsodium cannot initialise (no entropy source?)");
}

} // namespace tcp_store_auth

TcpStoreKey tcp_store_key(const std::string &token) {
  tcp_store_auth::need_sodium();
  std::string in = std::string("shardload rendezvous key v2") + '\0' + token;
  TcpStoreKey k;
  crypto_generichash(k.data(), k.size(), reinterpret_cast<const unsigned char *>(in.data()), in.size(), nullptr, 0);
  sodium_memzero(&in[0], in.size());
  return k;
}

bool tcp_store_token(std::string *token, std::string *err) {
  const char *text = getenv("SHARDLOAD_TOKEN");
  const char *file = getenv("SHARDLOAD_TOKEN_FILE");
  token->clear();
  if (text && file) {
    *err = "both SHARDLOAD_TOKEN and SHARDLOAD_TOKEN_FILE are set; set only one of them (the same on every rank)";
    return false;
  }
  if (text) {
    *token = text;
    if (token->size() < 16) {
      *err = "SHARDLOAD_TOKEN has " + std::to_string(token->size()) +
             " characters; the job's secret needs at least 16 (e.g. openssl rand -hex 32)";
      return false;
    }
    return true;
  }
  if (!file) return true;
  std::string path = file;
  // O_NONBLOCK: a FIFO named by mistake must not hang the rank; fstat refuses it below.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) {
    *err = "SHARDLOAD_TOKEN_FILE=" + path + ": cannot open: " + strerror(errno);
    return false;
  }
  struct stat st;
  bool ok = false;
  if (fstat(fd, &st) != 0) {
    *err = "SHARDLOAD_TOKEN_FILE=" + path + ": cannot stat: " + strerror(errno);
  } else if (!S_ISREG(st.st_mode)) {
    *err = "SHARDLOAD_TOKEN_FILE=" + path + " is not a regular file";
  } else if (st.st_mode & 077) {
    *err = "SHARDLOAD_TOKEN_FILE=" + path + " can be read or changed by other users; chmod 600 " + path;
  } else if (st.st_size > 4096) {
    *err = "SHARDLOAD_TOKEN_FILE=" + path + " holds " + std::to_string(st.st_size) +
           " bytes; it should hold only the job's secret";
  } else {
    char buf[4097];
    ssize_t n = ::read(fd, buf, sizeof buf - 1);
    if (n < 0) {
      *err = "SHARDLOAD_TOKEN_FILE=" + path + ": cannot read: " + strerror(errno);
    } else {
      token->assign(buf, size_t(n));
      sodium_memzero(buf, sizeof buf);
      while (!token->empty() && (token->back() == '\n' || token->back() == '\r')) token->pop_back();
      if (token->size() < 16)
        *err = "SHARDLOAD_TOKEN_FILE=" + path + " holds a secret of " + std::to_string(token->size()) +
               " characters; it needs at least 16";
      else ok = true;
    }
  }
  ::close(fd);
  if (!ok) token->clear();
  return ok;
}

bool tcp_store_allowed(const std::string &url, bool loopback, bool have_token, std::string *err) {
  if (have_token || loopback) return true;
  const char *insecure = getenv("SHARDLOAD_INSECURE_RENDEZVOUS");
  if (insecure && std::string(insecure) == "1") return true;
  *err = "the rendezvous " + url +
         " is not on a loopback address and no job token is set, so anyone who can reach its port could join "
         "this job or feed it forged addresses; " +
         kTokenAdvice +
         ". To run without authentication on a network you trust, set SHARDLOAD_INSECURE_RENDEZVOUS=1 on every "
         "rank (shardload load --insecure-rendezvous)";
  return false;
}

} // namespace shardload
