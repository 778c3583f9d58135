// MetricsFile: keeps a file with this server's Prometheus metrics (see
// metrics.h) for node_exporter's textfile collector, rewritten every
// `interval` on the server's io_context. Each rewrite goes through
// ReplaceFile (a fresh PATH.tmp.<random> renamed over PATH), so a reader
// sees a whole file, old or new, never a partial one. (Name it *.prom: the
// collector reads only those; the temporary file is not one.) The path is checked at
// start-up by CheckMetricsFile (common/option_checks.h).
//
// Thread safety: Start/Remove from the thread that owns the object; the
// timer's rewrites run on the io_context.
#pragma once

#include <chrono>
#include <string>
#include <utility>  // before Asio: 1.74 uses std::exchange without it

#include <boost/asio.hpp>

#include "shmcache/status.h"

namespace shmcache {

class Logger;
class Store;

class MetricsFile {
 public:
  MetricsFile(boost::asio::io_context& io, Store* store, Logger* log, std::string path,
              std::chrono::seconds interval);

  // Writes the file now, then every interval. A failed write is logged
  // once, until one succeeds again; the server keeps serving.
  void Start();
  // Removes the file: a stopped server has no metrics.
  void Remove();

 private:
  Status Write();
  // Writes now and schedules the next rewrite.
  void Rewrite();

  boost::asio::steady_timer timer_;
  Store* store_;
  Logger* log_;
  std::string path_;
  std::chrono::seconds interval_;
  bool failing_ = false;
};

}  // namespace shmcache
