#include "shmcache/client.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>

#include <fmt/format.h>

#include "common/server_elsewhere.h"
#include "format/cache_name.h"
#include "lib/cache_impl.h"
#include "lib/client_impl.h"

namespace shmcache {

using protocol::MsgType;
using protocol::WireReader;

// The milliseconds left until `deadline`, rounded up (a call made at once
// gets its whole timeout), at least 1 (0 would be no timeout at all).
static int MsLeft(std::chrono::steady_clock::time_point deadline) {
  auto left = std::chrono::ceil<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  return static_cast<int>(std::max<int64_t>(left.count(), 1));
}

static std::chrono::steady_clock::time_point DeadlineIn(int ms) {
  return std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
}

Status ClientImpl::Create(const ClientOptions& options,
                          std::shared_ptr<ClientImpl>* out) {
  Status s = CheckHost(options.hostname);
  if (!s.ok()) return s;
  int port;
  s = ResolvePort(options.port, &port);
  if (!s.ok()) return s;
  if (options.request_timeout_ms <= 0) {
    return Status::InvalidArgument(
        fmt::format("request_timeout_ms {} is not a positive number of milliseconds (the "
                    "default is 5000)",
                    options.request_timeout_ms));
  }
  InstancePaths paths = MakeInstancePaths(port, options.run_dir, "");
  s = CheckRunDir(paths.run_dir);
  if (!s.ok()) return s;
  std::shared_ptr<ClientImpl> impl(new ClientImpl());
  impl->options_ = options;
  impl->port_ = port;
  {
    ForkSafeLock lock(&impl->paths_mu_);
    impl->paths_ = std::move(paths);
  }
  ForkSafeLock lock(&impl->mu_);
  s = impl->ConnectLocked(DeadlineIn(options.request_timeout_ms));
  if (!s.ok()) return s;
  *out = std::move(impl);
  return Status::OK();
}

Status ClientImpl::ConnectLocked(Deadline deadline) {
  Status s = OpenAndHello(deadline);
  // Read only on a failure, after the connect's wait: a file in /dev/shm
  // and the holder's /proc entries.
  return s.ok() ? s
                : ExplainNoServerHere(port_, paths().run_dir, options_.admin_command, s);
}

Status ClientImpl::OpenAndHello(Deadline deadline) {
  if (conn_) conn_->Abandon();
  conn_.reset();
  fork_gen_ = ForkGeneration();
  std::unique_ptr<Connection> conn;
  Status s = Connection::Open(paths().socket_path, port_, MsLeft(deadline), &conn);
  if (!s.ok()) return s;
  std::string body;
  size_t off = 0;
  s = conn->Call(protocol::HelloRequest::kType,
                 protocol::EncodeBody(
                     protocol::HelloRequest{.pid = static_cast<uint32_t>(getpid())}),
                 &body, &off, MsLeft(deadline));
  if (!s.ok()) return s;
  protocol::HelloResponse hello;
  if (!protocol::DecodeBody(
          std::span(reinterpret_cast<const std::byte*>(body.data()) + off,
                    body.size() - off),
          &hello)) {
    return Malformed(protocol::HelloRequest::kName);
  }
  client_id_.store(hello.client_id, std::memory_order_relaxed);
  {
    ForkSafeLock lock(&paths_mu_);
    paths_.shm_prefix = hello.shm_prefix;
  }
  conn_ = std::move(conn);
  return Status::OK();
}

Status ClientImpl::Exchange(MsgType type, const std::string& request, std::string* body,
                            WireReader* reader, bool reconnect) {
  const int timeout_ms = protocol::RequestTimeoutMs(type, options_.request_timeout_ms);
  const Deadline deadline = DeadlineIn(timeout_ms);
  if (!mu_.try_lock_until(deadline)) {
    return Status::Unavailable(fmt::format(
        "cache server on port {} is unreachable (timed out: {} ms went by while other "
        "threads' requests to it waited for answers)",
        port_, timeout_ms));
  }
  ForkSafeLock lock(&mu_, std::adopt_lock);
  bool connected_now = false;
  if (!conn_ || conn_->broken() || fork_gen_ != ForkGeneration()) {
    if (!reconnect) {
      return Status::Unavailable(
          fmt::format("not connected to the cache server on port {}", port_));
    }
    Status s = ConnectLocked(deadline);
    if (!s.ok()) return s;
    connected_now = true;
  }
  size_t off = 0;
  Status s = conn_->Call(type, request, body, &off, MsLeft(deadline));
  if (!s.ok() && reconnect && !connected_now && conn_->closed_before_request()) {
    // A daemon killed since this client's last request closed the
    // connection, which nothing read since (hits and spilled rows need no
    // daemon): the request, which it never read, goes to whoever serves
    // the instance now. A restarted daemon answers it; none gives the
    // connect's error, which says the server is not running.
    s = ConnectLocked(deadline);
    if (!s.ok()) return s;
    s = conn_->Call(type, request, body, &off, MsLeft(deadline));
  }
  if (!s.ok()) return s;
  *reader = WireReader(std::span(reinterpret_cast<const std::byte*>(body->data()) + off,
                                 body->size() - off));
  return s;
}

Status ClientImpl::Malformed(const char* request_name) {
  return Status::Corruption(
      fmt::format("malformed answer to {} from the cache server", request_name));
}

// ---- Client -------------------------------------------------------------

Client::Client(std::shared_ptr<ClientImpl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

Status Client::Connect(const ClientOptions& options, std::unique_ptr<Client>* out) {
  std::shared_ptr<ClientImpl> impl;
  Status s = ClientImpl::Create(options, &impl);
  if (!s.ok()) return s;
  out->reset(new Client(std::move(impl)));
  return Status::OK();
}

Status Client::CreateSession(uint32_t* session_id) {
  protocol::CreateSessionResponse created;
  Status s = impl_->Call(protocol::CreateSessionRequest{}, &created);
  if (s.ok()) *session_id = created.session_id;
  return s;
}

Status Client::DestroySession(uint32_t session_id) {
  return impl_->Call(protocol::DestroySessionRequest{.session_id = session_id});
}

Status Client::CheckSession(uint32_t session_id) {
  return impl_->Call(protocol::CheckSessionRequest{.session_id = session_id});
}

Status Client::OpenCache(const CacheOptions& options, std::unique_ptr<Cache>* out) {
  std::string name = options.name.empty() ? options.fingerprint : options.name;
  if (name.empty()) {
    return Status::InvalidArgument("a cache needs a name or a fingerprint");
  }
  Status s = CheckCacheName(name, options.fingerprint);
  if (!s.ok()) return s;
  protocol::OpenCacheResponse opened;
  s = impl_->Call(protocol::OpenCacheRequest{.session_id = options.session_id,
                                             .name = name,
                                             .fingerprint = options.fingerprint,
                                             .size_mb = options.size_mb,
                                             .spill_requested = options.spill_requested},
                  &opened);
  if (!s.ok()) return s;
  std::shared_ptr<CacheImpl> cache;
  s = CacheImpl::Attach(impl_, opened.cache_id, options.session_id, &cache);
  if (!s.ok()) return s;
  out->reset(new Cache(std::move(cache)));
  return Status::OK();
}

Status Client::ListSessions(std::vector<SessionInfo>* out) {
  protocol::ListSessionsResponse listed;
  Status s = impl_->Call(protocol::ListSessionsRequest{}, &listed);
  if (s.ok()) *out = std::move(listed.sessions);
  return s;
}

Status Client::GetServerInfo(ServerInfo* out) {
  protocol::ServerInfoResponse info;
  Status s = impl_->Call(protocol::ServerInfoRequest{}, &info);
  if (s.ok()) *out = std::move(info.info);
  return s;
}

Status Client::StopServer() { return impl_->Call(protocol::StopRequest{}); }

}  // namespace shmcache
