// A consumer of gravac::gravac: one trainer step on two thread ranks.
#include <atomic>
#include <cstdio>

#include "consumer_check.hpp"

int main() {
  std::atomic<int> bad{0};
  gravac::run_ranks(2, [&](gravac::thread_communicator& comm) { bad += consumer::run_step(comm); });
  std::printf("consumer_threads: %s\n", bad == 0 ? "ok" : "FAILED");
  return bad == 0 ? 0 : 1;
}
