// The pulses that keep Gloo's event loop ticking while a call waits for its tick (loop_hurry.h).
#include "loop_hurry.h"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <system_error>

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <gloo/transport/tcp/device.h>

namespace shardload::gloo_internal {

std::shared_ptr<LoopHurry> LoopHurry::attach(gloo::transport::Device &dev) {
  auto *tcp = dynamic_cast<gloo::transport::tcp::Device *>(&dev);
  if (!tcp) return nullptr;
  int fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (fd < 0) return nullptr;
  std::shared_ptr<LoopHurry> h(new LoopHurry(fd));
  try {
    tcp->registerDescriptor(fd, EPOLLIN, h.get());
  } catch (...) {
    return nullptr; // closes FD
  }
  return h;
}

LoopHurry::~LoopHurry() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  // After the device (its loop thread joined); should one outlive this, closing the only
  // descriptor of the eventfd takes it out of the loop's epoll set.
  ::close(fd_);
}

void LoopHurry::handleEvents(int) {
  uint64_t v;
  while (::read(fd_, &v, sizeof v) < 0 && errno == EINTR) {
  }
}

void LoopHurry::begin(std::chrono::milliseconds most) {
  std::lock_guard<std::mutex> lock(mu_);
  holds_++;
  until_ = std::max(until_, Clock::now() + most);
  if (!thread_.joinable()) {
    try {
      thread_ = std::thread([this] { run(); }); // inherits the caller's blocked SIGPIPE
    } catch (const std::system_error &) {        // no thread: no hurry
    }
  }
  cv_.notify_all();
}

void LoopHurry::end() {
  std::lock_guard<std::mutex> lock(mu_);
  holds_--; // the thread sleeps once none is left
}

void LoopHurry::run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    if (holds_ == 0 || Clock::now() >= until_) {
      cv_.wait(lock); // the next begin (or the end of this) wakes it
      continue;
    }
    uint64_t one = 1;
    while (::write(fd_, &one, sizeof one) < 0 && errno == EINTR) {
    }
    cv_.wait_for(lock, kPulse);
  }
}

LoopHurry::Hold::Hold(std::shared_ptr<LoopHurry> h, std::chrono::milliseconds most) : h_(std::move(h)) {
  if (h_) h_->begin(most);
}

LoopHurry::Hold::~Hold() {
  if (h_) h_->end();
}

} // namespace shardload::gloo_internal
