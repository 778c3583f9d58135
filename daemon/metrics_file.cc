#include "daemon/metrics_file.h"

#include <unistd.h>

#include <vector>

#include "common/metrics.h"
#include "daemon/logger.h"
#include "daemon/replace_file.h"
#include "daemon/store.h"

namespace shmcache {

MetricsFile::MetricsFile(boost::asio::io_context& io, Store* store, Logger* log,
                         std::string path, std::chrono::seconds interval)
    : timer_(io), store_(store), log_(log), path_(std::move(path)), interval_(interval) {}

void MetricsFile::Start() { Rewrite(); }

void MetricsFile::Rewrite() {
  Status s = Write();
  if (!s.ok() && !failing_) {
    log_->Warn("cannot rewrite the metrics file: {}", s.message());
  }
  failing_ = !s.ok();
  timer_.expires_after(interval_);
  timer_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) Rewrite();
  });
}

Status MetricsFile::Write() {
  ServerInfo info;
  std::vector<SessionInfo> sessions;
  store_->FillServerInfo(&info);
  store_->ListSessions(&sessions);
  // Readable by node_exporter, which seldom runs as the server's user.
  return ReplaceFile(path_, PrometheusText(info, sessions), 0644);
}

void MetricsFile::Remove() {
  timer_.cancel();
  unlink(path_.c_str());
}

}  // namespace shmcache
