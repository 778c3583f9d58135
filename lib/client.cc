#include "shmcache/client.h"

#include <unistd.h>

#include "cache_impl.h"
#include "cache_name.h"
#include "client_impl.h"

namespace shmcache {

using protocol::MsgType;
using protocol::WireReader;
using protocol::WireWriter;

Status ClientImpl::Create(const ClientOptions& options,
                          std::shared_ptr<ClientImpl>* out) {
  Status s = CheckHost(options.hostname);
  if (!s.ok()) return s;
  int port;
  s = ResolvePort(options.port, &port);
  if (!s.ok()) return s;
  std::shared_ptr<ClientImpl> impl(new ClientImpl());
  impl->options_ = options;
  impl->paths_ = MakeInstancePaths(port, options.run_dir, "");
  std::lock_guard lock(impl->mu_);
  s = impl->ConnectLocked();
  if (!s.ok()) return s;
  *out = std::move(impl);
  return Status::OK();
}

Status ClientImpl::ConnectLocked() {
  if (conn_) conn_->Abandon();
  conn_.reset();
  fork_gen_ = ForkGeneration();
  std::unique_ptr<Connection> conn;
  Status s = Connection::Open(paths_.socket_path, paths_.port,
                              options_.request_timeout_ms, &conn);
  if (!s.ok()) return s;
  WireWriter hello;
  hello.U32(static_cast<uint32_t>(getpid()));
  std::string body;
  size_t off = 0;
  s = conn->Call(MsgType::kHello, hello.body(), &body, &off);
  if (!s.ok()) return s;
  WireReader r(std::span(reinterpret_cast<const std::byte*>(body.data()) + off,
                         body.size() - off));
  uint32_t id = r.U32();
  std::string prefix = r.Str();
  if (!r.ok()) return Status::Corruption("malformed hello response");
  client_id_ = id;
  paths_.shm_prefix = prefix;
  conn_ = std::move(conn);
  return Status::OK();
}

Status ClientImpl::Call(MsgType type, const WireWriter& request,
                        std::string* body, WireReader* reader) {
  std::lock_guard lock(mu_);
  if (!conn_ || conn_->broken() || fork_gen_ != ForkGeneration()) {
    Status s = ConnectLocked();
    if (!s.ok()) return s;
  }
  size_t off = 0;
  Status s = conn_->Call(type, request.body(), body, &off);
  if (!s.ok()) return s;
  *reader = WireReader(std::span(
      reinterpret_cast<const std::byte*>(body->data()) + off, body->size() - off));
  return s;
}

// ---- Client -------------------------------------------------------------

Client::Client(std::shared_ptr<ClientImpl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

Status Client::Connect(const ClientOptions& options,
                       std::unique_ptr<Client>* out) {
  std::shared_ptr<ClientImpl> impl;
  Status s = ClientImpl::Create(options, &impl);
  if (!s.ok()) return s;
  out->reset(new Client(std::move(impl)));
  return Status::OK();
}

Status Client::CreateSession(uint32_t* session_id) {
  WireWriter w;
  std::string body;
  WireReader r({});
  Status s = impl_->Call(MsgType::kCreateSession, w, &body, &r);
  if (!s.ok()) return s;
  uint32_t id = r.U32();
  if (!r.Done()) return Status::Corruption("malformed response");
  *session_id = id;
  return Status::OK();
}

static Status SessionCall(ClientImpl& impl, MsgType type, uint32_t id) {
  WireWriter w;
  w.U32(id);
  std::string body;
  WireReader r({});
  return impl.Call(type, w, &body, &r);
}

Status Client::DestroySession(uint32_t session_id) {
  return SessionCall(*impl_, MsgType::kDestroySession, session_id);
}

Status Client::CheckSession(uint32_t session_id) {
  return SessionCall(*impl_, MsgType::kCheckSession, session_id);
}

Status Client::OpenCache(const CacheOptions& options,
                         std::unique_ptr<Cache>* out) {
  std::string name = options.name.empty() ? options.fingerprint : options.name;
  if (name.empty()) {
    return Status::InvalidArgument("a cache needs a name or a fingerprint");
  }
  Status s = CheckCacheName(name, options.fingerprint);
  if (!s.ok()) return s;
  WireWriter w;
  w.U32(options.session_id);
  w.Str(name);
  w.Str(options.fingerprint);
  w.U64(options.size_mb);
  w.U8(options.spilling ? 1 : 0);
  std::string body;
  WireReader r({});
  s = impl_->Call(MsgType::kOpenCache, w, &body, &r);
  if (!s.ok()) return s;
  uint32_t cache_id = r.U32();
  if (!r.Done()) return Status::Corruption("malformed open response");
  std::shared_ptr<CacheImpl> cache;
  s = CacheImpl::Attach(impl_, cache_id, options.session_id, &cache);
  if (!s.ok()) return s;
  out->reset(new Cache(std::move(cache)));
  return Status::OK();
}

Status Client::ListSessions(std::vector<SessionInfo>* out) {
  WireWriter w;
  std::string body;
  WireReader r({});
  Status s = impl_->Call(MsgType::kListSessions, w, &body, &r);
  if (!s.ok()) return s;
  std::vector<SessionInfo> sessions;
  if (!protocol::ReadSessions(r, &sessions) || !r.Done()) {
    return Status::Corruption("malformed session listing");
  }
  *out = std::move(sessions);
  return Status::OK();
}

Status Client::GetServerInfo(ServerInfo* out) {
  WireWriter w;
  std::string body;
  WireReader r({});
  Status s = impl_->Call(MsgType::kServerInfo, w, &body, &r);
  if (!s.ok()) return s;
  ServerInfo info;
  if (!protocol::ReadServerInfo(r, &info) || !r.Done()) {
    return Status::Corruption("malformed server info");
  }
  *out = std::move(info);
  return Status::OK();
}

Status Client::StopServer() {
  WireWriter w;
  std::string body;
  WireReader r({});
  return impl_->Call(MsgType::kStop, w, &body, &r);
}

}  // namespace shmcache
