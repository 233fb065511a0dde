// TCP client helpers the rendezvous stores share (tcp_store.cc, and any other store that
// dials rank 0 or torchrun's agent): a bounded connect and send, poll deadlines, address names.
#pragma once

#include <chrono>
#include <string>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

namespace shardload {
namespace tcp_socket {

using Clock = std::chrono::steady_clock;

// Milliseconds until DEADLINE for poll(): 0 once past, and never more than poll can take.
inline int remaining_ms(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : left > 1000000 ? 1000000 : int(left);
}

// Milliseconds since T, for messages.
inline long ms_since(Clock::time_point t) {
  return long(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count());
}

// "HOST:PORT" ("[HOST]:PORT" for an IPv6 address), for messages.
inline std::string host_port(const std::string &host, int port) {
  return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

inline void set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

// One non-blocking connect attempt to any address of HOST:PORT, bounded by DEADLINE (and
// 2 s per address). The connected descriptor (non-blocking, close-on-exec), or -1 with *ERR
// saying why. Callers retry until their own timeout.
int try_connect(const std::string &host, int port, Clock::time_point deadline, std::string *err);

// Sends all of MSG on the non-blocking FD, waiting for room until DEADLINE. 0 once sent; -1
// when the peer took nothing more before DEADLINE (stuck, or its host unreachable); else the
// errno of the failure (the peer closed or reset the connection).
int send_all(int fd, const std::string &msg, Clock::time_point deadline);

} // namespace tcp_socket
} // namespace shardload
