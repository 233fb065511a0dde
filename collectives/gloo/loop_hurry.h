// Hurrying Gloo's tcp event loop through the calls that wait for its tick.
//
// Gloo (this packaged version, gloo/transport/tcp/loop.cc) runs a device's event loop as
// epoll_wait with a 10 ms timeout, and Loop::unregisterDescriptor, called from any thread but
// the loop's, returns only after the loop's next tick (so that no handler runs for the
// descriptor once it returns). A tick comes when an event arrives or the 10 ms run out, so on
// a quiet loop each of these waits up to 10 ms: a pair that connects out (Pair::connect closes
// its listener first), every pair destroyed (Pair::changeState(CLOSED)), and the device itself
// (Loop::~Loop joins the loop thread after its epoll_wait). At world W a rank's teardown waited
// up to W x 10 ms, and the command as long again for its slowest rank.
//
// A LoopHurry registers an eventfd of its own with the device's loop and, while held, a thread
// of its own writes to it every kPulse: each write is an event, the loop ticks, and those
// calls return within about kPulse. Pulses, not an eventfd kept readable: a loop kept spinning
// took the CPU the tearing-down thread needed wherever ranks outnumber cores. A hold pulses
// for at most the time it was given (then the loop ticks every 10 ms again, as without one),
// so a call that does wait for a peer (a connect to a host that does not answer) costs little.
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

#include <gloo/transport/device.h>
#include <gloo/transport/tcp/loop.h>

namespace shardload::gloo_internal {

class LoopHurry : public gloo::transport::tcp::Handler {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::microseconds kPulse{100};

  // A hurry for DEV's loop; null when DEV is not a tcp device or the eventfd cannot be made
  // or registered (then nothing is hurried, as before). It must outlive DEV (the loop calls
  // it): a communicator holds it, declared before its device (gloo_internal.h).
  static std::shared_ptr<LoopHurry> attach(gloo::transport::Device &dev);
  // Stops the pulses (joins the thread) and closes the eventfd.
  ~LoopHurry() override;
  LoopHurry(const LoopHurry &) = delete;
  LoopHurry &operator=(const LoopHurry &) = delete;

  // Pulses H's loop (H null: nothing) while in scope, for MOST at the longest. Holds nest, from
  // any threads but the loop's. Never throws: without a thread for the pulses, nothing hurries.
  class Hold {
   public:
    Hold(std::shared_ptr<LoopHurry> h, std::chrono::milliseconds most);
    ~Hold();
    Hold(const Hold &) = delete;
    Hold &operator=(const Hold &) = delete;

   private:
    std::shared_ptr<LoopHurry> h_;
  };

  // The loop's: takes the pulse.
  void handleEvents(int events) override;

 private:
  explicit LoopHurry(int fd) : fd_(fd) {}
  void begin(std::chrono::milliseconds most);
  void end();
  void run();

  const int fd_;
  std::mutex mu_;
  std::condition_variable cv_;
  int holds_ = 0;
  bool stop_ = false;
  Clock::time_point until_; // no pulses past it
  std::thread thread_;      // the pulses, from the first hold
};

} // namespace shardload::gloo_internal
