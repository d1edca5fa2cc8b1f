// The server's view of a model the tools loaded (src/apps/model_loading.h): the apps build it,
// the server (src/server) knows only ServerModel, not the apps' loading code.
#pragma once

#include "apps/model_loading.h"
#include "server/server.h"

namespace ppx::app {

// The parts of a loaded model (which must outlive the Server) that the server uses.
server::ServerModel server_model(const LoadedModel& m);

}  // namespace ppx::app
