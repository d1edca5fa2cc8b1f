// What every chat session shares with the server, apart from the network: options, the loaded
// model, the session slots, the live-session list (to end them all on stop) and the metrics.
#pragma once

#include <condition_variable>
#include <list>
#include <memory>
#include <mutex>
#include <vector>

#include "server/metrics.h"
#include "server/server.h"

namespace ppx::server {

class ChatSession;

struct SessionHub {
  ServerOptions opts;
  ServerModel model;
  Metrics metrics;
  std::mutex backend_mu;  // creating codec streams / steppers

  std::mutex mu;  // guards everything below
  std::condition_variable cv;
  std::vector<bool> slot_used;
  int in_use = 0;
  int workers = 0;  // session worker threads still running
  bool stopping = false, stopped = false;
  std::list<std::weak_ptr<ChatSession>> sessions;

  // A free slot index, or -1 when all are taken or the server is stopping.
  int acquire_slot();
  // Called by a session's worker as its very last step.
  void release_slot(int slot);
  int sessions_in_use();
};

}  // namespace ppx::server
