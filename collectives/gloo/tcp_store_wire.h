// What the rendezvous store's server (tcp_store_server.cc) and client (tcp_store.cc) share:
// the op and status codes, the protocol's constants and the frame encoding (tcp_store.h).
// Internal: nothing outside the store includes it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace shardload {
namespace tcp_store_wire {

enum Op : uint8_t { OP_HELLO = 1, OP_SET = 2, OP_GET = 3, OP_CHECK = 4, OP_WAIT = 5, OP_AUTH = 6, OP_ADD = 7 };
enum Status : uint8_t {
  ST_OK = 0,
  ST_MISSING = 1,
  ST_TIMEOUT = 2,
  ST_BAD = 3,
  ST_DENIED = 4,
  ST_CONFLICT = 5,
  ST_TOOBIG = 6
};

// 3: ADD (the rendezvous counts its ranks in).
constexpr char kProtocol[] = "3";
// Before authentication a peer may send only a HELLO or an AUTH: a few hundred bytes.
constexpr uint32_t kMaxHandshakeFrame = 1024;
constexpr size_t kMaxKey = 4096;
constexpr uint32_t kMaxFields = 1u << 20;

inline void put_u32(std::string &s, uint32_t v) {
  char b[4] = {char(v >> 24), char(v >> 16), char(v >> 8), char(v)};
  s.append(b, 4);
}

inline uint32_t get_u32(const char *p) {
  const unsigned char *u = reinterpret_cast<const unsigned char *>(p);
  return uint32_t(u[0]) << 24 | uint32_t(u[1]) << 16 | uint32_t(u[2]) << 8 | u[3];
}

inline std::string frame(uint8_t code, const std::vector<std::string> &fields) {
  std::string body(1, char(code));
  put_u32(body, uint32_t(fields.size()));
  for (const auto &f : fields) {
    put_u32(body, uint32_t(f.size()));
    body += f;
  }
  std::string out;
  put_u32(out, uint32_t(body.size()));
  return out + body;
}

// Parses one frame body; false when malformed.
inline bool parse_body(const char *p, size_t n, uint8_t *code, std::vector<std::string> *fields) {
  if (n < 5) return false;
  *code = uint8_t(p[0]);
  uint32_t count = get_u32(p + 1);
  if (count > kMaxFields) return false;
  size_t off = 5;
  fields->clear();
  for (uint32_t i = 0; i < count; i++) {
    if (n - off < 4) return false;
    uint32_t len = get_u32(p + off);
    off += 4;
    if (n - off < len) return false;
    fields->emplace_back(p + off, len);
    off += len;
  }
  return off == n;
}

} // namespace tcp_store_wire
} // namespace shardload
