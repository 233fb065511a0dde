// The bounded TCP connect and send the rendezvous stores share (declared in tcp_socket.h).
#include "tcp_socket.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <netdb.h>
#include <poll.h>
#include <unistd.h>

namespace shardload {
namespace tcp_socket {

int try_connect(const std::string &host, int port, Clock::time_point deadline, std::string *err) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  int gai = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (gai != 0) {
    *err = std::string("cannot resolve '") + host + "': " + gai_strerror(gai);
    return -1;
  }
  int fd = -1;
  for (addrinfo *ai = res; ai && fd < 0; ai = ai->ai_next) {
    fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0) continue;
    int rc = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p = {fd, POLLOUT, 0};
      rc = ::poll(&p, 1, std::min(remaining_ms(deadline), 2000));
      int soerr = 0;
      socklen_t len = sizeof soerr;
      if (rc == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len) == 0 && soerr == 0) {
        rc = 0;
      } else {
        errno = rc == 0 ? ETIMEDOUT : soerr ? soerr : errno;
        rc = -1;
      }
    }
    if (rc != 0) {
      *err = strerror(errno);
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(res);
  return fd;
}

int send_all(int fd, const std::string &msg, Clock::time_point deadline) {
  for (size_t off = 0; off < msg.size();) {
    ssize_t n = ::send(fd, msg.data() + off, msg.size() - off, MSG_NOSIGNAL);
    if (n > 0) {
      off += size_t(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p = {fd, POLLOUT, 0};
      if (::poll(&p, 1, remaining_ms(deadline)) == 0) return -1;
      continue;
    }
    return errno != 0 ? errno : EPIPE; // send() returned 0: no progress is possible
  }
  return 0;
}

} // namespace tcp_socket
} // namespace shardload
