#include "metrics_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <vector>

#include "logger.h"
#include "metrics.h"
#include "store.h"

namespace shmcache {

MetricsFile::MetricsFile(boost::asio::io_context& io, Store* store, Logger* log,
                         std::string path, std::chrono::seconds interval)
    : timer_(io), store_(store), log_(log), path_(std::move(path)),
      interval_(interval) {}

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
  std::string text = PrometheusText(info, sessions);
  std::string tmp = path_ + ".tmp";
  // Readable by node_exporter, which seldom runs as the server's user.
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Status::FromErrno("cannot write metrics file " + tmp, errno);
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      Status s = Status::FromErrno("cannot write metrics file " + tmp, errno);
      close(fd);
      unlink(tmp.c_str());
      return s;
    }
    done += static_cast<size_t>(n);
  }
  close(fd);
  if (rename(tmp.c_str(), path_.c_str()) != 0) {
    Status s = Status::FromErrno("cannot rename " + tmp + " to " + path_, errno);
    unlink(tmp.c_str());
    return s;
  }
  return Status::OK();
}

void MetricsFile::Remove() {
  timer_.cancel();
  unlink(path_.c_str());
}

}  // namespace shmcache
