#include "benchmarks/bench_util.h"

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include <nlohmann/json.hpp>

namespace bench {
namespace {

uint64_t Mix(uint64_t* s) {
  // splitmix64
  uint64_t z = (*s += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

bool ReadAll(int fd, void* p, size_t n) {
  auto* c = static_cast<char*>(p);
  while (n > 0) {
    ssize_t r = read(fd, c, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    c += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

bool WriteAll(int fd, const void* p, size_t n) {
  const auto* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t r = write(fd, c, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    c += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

// A figure to `decimals` places, as the JSON has always given it.
double Rounded(double v, int decimals) {
  double scale = std::pow(10.0, decimals);
  return std::round(v * scale) / scale;
}

}  // namespace

double NowSec() {
  return std::chrono::duration<double>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double ProcessCpuSec(int pid) {
  if (pid <= 0) return -1;
  std::FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
  if (f == nullptr) return -1;
  char buf[1024];
  const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = 0;
  // Fields 14 and 15 (utime, stime), counted from the one after the
  // command's closing parenthesis (field 3; a command may hold spaces).
  const char* p = std::strrchr(buf, ')');
  unsigned long long utime = 0, stime = 0;
  if (p == nullptr ||
      std::sscanf(p + 2, "%*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %llu %llu", &utime,
                  &stime) != 2) {
    return -1;
  }
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

double ChildrenCpuSec() {
  rusage u;
  getrusage(RUSAGE_CHILDREN, &u);
  auto sec = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) / 1e6;
  };
  return sec(u.ru_utime) + sec(u.ru_stime);
}

std::vector<uint32_t> RandomIndices(size_t count, uint32_t n, uint64_t seed) {
  std::vector<uint32_t> v(count);
  for (auto& x : v) x = static_cast<uint32_t>(Mix(&seed) % n);
  return v;
}

void FillRandom(void* buf, size_t n, uint64_t seed) {
  auto* p = static_cast<unsigned char*>(buf);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t v = Mix(&seed);
    std::memcpy(p + i, &v, 8);
  }
  for (; i < n; ++i) p[i] = static_cast<unsigned char>(Mix(&seed));
}

double TimedRate(double seconds, const std::function<void(uint64_t)>& op) {
  return TimedRateBatched(seconds, 1, op);
}

double TimedRateBatched(double seconds, int batch,
                        const std::function<void(uint64_t)>& op) {
  // The median of three runs of a third of the time each: one disturbed
  // run on a shared machine does not move the figure.
  double runs[3] = {};
  uint64_t start = 0;
  for (double& r : runs) r = TimedRateOnce(seconds / 3, batch, op, &start);
  std::sort(runs, runs + 3);
  return runs[1];
}

double TimedRateOnce(double seconds, int batch, const std::function<void(uint64_t)>& op,
                     uint64_t* next) {
  // Warm-up: a tenth of the time, at most 0.05 s.
  double w_end = NowSec() + std::min(0.05, seconds / 10);
  uint64_t i = *next;
  while (NowSec() < w_end) {
    for (int k = 0; k < 8; ++k) op(i++);
  }
  const double t0 = NowSec();
  double t1;  // set by the loop
  uint64_t calls = 0;
  do {
    for (int k = 0; k < 8; ++k) op(i++);
    calls += 8;
    t1 = NowSec();
  } while (t1 - t0 < seconds);
  *next = i;
  return static_cast<double>(calls) * batch / (t1 - t0);
}

double RunProcs(int procs, const std::function<double(int)>& body) {
  int start[2], result[2];
  if (pipe(start) != 0 || pipe(result) != 0) return -1;
  std::fflush(nullptr);
  std::vector<pid_t> pids;
  for (int k = 0; k < procs; ++k) {
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
      close(start[1]);
      close(result[0]);
      char go;
      double rate = -1;
      if (ReadAll(start[0], &go, 1)) rate = body(k);
      WriteAll(result[1], &rate, sizeof rate);
      std::fflush(nullptr);
      _exit(0);
    }
    pids.push_back(pid);
  }
  close(start[0]);
  close(result[1]);
  // Let the children reach the barrier, then release them together.
  std::string go(static_cast<size_t>(procs), 'g');
  WriteAll(start[1], go.data(), go.size());
  close(start[1]);
  double sum = 0;
  bool ok = true;
  for (int k = 0; k < procs; ++k) {
    double r;
    if (!ReadAll(result[0], &r, sizeof r) || r < 0) ok = false;
    else sum += r;
  }
  close(result[0]);
  for (pid_t p : pids) {
    int st;
    while (waitpid(p, &st, 0) < 0 && errno == EINTR) {
    }
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) ok = false;
  }
  return ok ? sum : -1;
}

std::vector<int> DefaultSweep() {
  const int cpus = std::max(1, static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)));
  std::vector<int> out;
  for (int n = 1; n < cpus; n *= 2) out.push_back(n);
  out.push_back(cpus);
  return out;
}

bool Config::Wants(const std::string& s) const {
  return sections.empty() ||
         std::find(sections.begin(), sections.end(), s) != sections.end();
}

void Report::Add(const std::string& bench, const std::string& system,
                 const std::string& variant, size_t row_bytes, int procs,
                 double rows_per_s) {
  Result r{bench,
           system,
           variant,
           row_bytes,
           procs,
           rows_per_s,
           rows_per_s * static_cast<double>(row_bytes) / 1e9};
  if (!quiet_) {
    std::fprintf(stderr, "  %-8s %-9s %-22s %7zu B  P=%d  %12.0f rows/s  %7.2f GB/s\n",
                 bench.c_str(), system.c_str(), variant.c_str(), row_bytes, procs,
                 rows_per_s, r.gb_per_s);
  }
  results_.push_back(r);
}

void Report::Skip(const std::string& what, const std::string& reason) {
  std::fprintf(stderr, "  skipped %s: %s\n", what.c_str(), reason.c_str());
  skipped_.emplace_back(what, reason);
}

void Report::Value(const std::string& key, double v) {
  std::fprintf(stderr, "  %-40s %.2f\n", key.c_str(), v);
  values_.emplace_back(key, v);
}

bool Report::Write(const std::string& path) const {
  using Json = nlohmann::ordered_json;
  Json results = Json::array();
  for (const Result& r : results_) {
    results.push_back({{"bench", r.bench},
                       {"system", r.system},
                       {"variant", r.variant},
                       {"row_bytes", r.row_bytes},
                       {"procs", r.procs},
                       {"rows_per_s", Rounded(r.rows_per_s, 1)},
                       {"gb_per_s", Rounded(r.gb_per_s, 4)}});
  }
  Json values = Json::object();
  for (const auto& [key, v] : values_) values[key] = Rounded(v, 4);
  Json skipped = Json::object();
  for (const auto& [what, why] : skipped_) skipped[what] = why;
  Json all = {{"results", results}, {"values", values}, {"skipped", skipped}};
  std::string text = all.dump(2, ' ', false, Json::error_handler_t::replace) + "\n";
  FILE* f = path == "-" ? stdout : std::fopen(path.c_str(), "w");
  if (f == nullptr) return false;
  bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (f != stdout) ok = std::fclose(f) == 0 && ok;
  return ok;
}

}  // namespace bench
