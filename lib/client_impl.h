// ClientImpl: the shared state behind Client and every Cache it opened:
// the control connection and the instance's paths.
//
// Thread safety: Call() serialises requests under a mutex (fork-safe: a
// fork waits for a call in flight). After fork() the child notices on its
// next Call (the fork generation changed), drops the inherited connection
// without shutting it down and opens its own.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "connection.h"
#include "fork_safety.h"
#include "instance.h"
#include "protocol.h"
#include "shmcache/options.h"
#include "shmcache/status.h"

namespace shmcache {

class ClientImpl {
 public:
  static Status Create(const ClientOptions& options,
                       std::shared_ptr<ClientImpl>* out);

  // One request/response. On success *reader reads the response payload
  // (it points into *body). Reconnects first when the connection was
  // broken or inherited across fork().
  Status Call(protocol::MsgType type, const protocol::WireWriter& request,
              std::string* body, protocol::WireReader* reader);

  const InstancePaths& paths() const { return paths_; }
  uint32_t client_id() const { return client_id_; }
  int port() const { return paths_.port; }

 private:
  ClientImpl() = default;
  Status ConnectLocked();

  ForkSafeMutex mu_{LockRank::kClient};
  ClientOptions options_;
  InstancePaths paths_;
  std::unique_ptr<Connection> conn_;
  uint64_t fork_gen_ = 0;
  uint32_t client_id_ = 0;
};

}  // namespace shmcache
