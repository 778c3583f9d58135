#include "common/server_flags.h"

#include "common/command_line.h"

namespace shmcache {

std::vector<CLI::Option*> AddServerFlags(CommandLine& cl, ServerFlags* f) {
  return {
      cl.AddValue("-w,--workers",
                  [f](const std::string& v) { return ParseWorkers(v, &f->workers); }),
      cl.AddValue("-s,--spilldir",
                  [f](const std::string& v) {
                    // Absolute here (an empty value too, which would
                    // otherwise mean "no spill dir" to one reader and a
                    // missing value to another); the rest in CheckServerFlags.
                    f->spill_dir = v;
                    return CheckAbsolutePath("spill directory", v);
                  }),
      cl.AddValue("-l,--loglevel",
                  [f](const std::string& v) { return ParseLogLevel(v, &f->log_level); }),
      cl.AddValue("-r,--memory_cap_ratio",
                  [f](const std::string& v) {
                    return ParseMemoryCapRatio(v, &f->memory_cap_ratio);
                  }),
      cl.AddValue("--memory_cap_mb",
                  [f](const std::string& v) {
                    return ParseMemoryCapMb(v, &f->memory_cap_bytes);
                  }),
      cl.AddValue("--shm_dir",
                  [f](const std::string& v) {
                    f->shm_dir = v;
                    return CheckAbsolutePath("shared-memory directory", v);
                  }),
      cl.AddValue("--log_dir",
                  [f](const std::string& v) {
                    f->log_dir = v;
                    return CheckAbsolutePath("log directory", v);
                  }),
      cl.AddValue("--metrics_file",
                  [f](const std::string& v) {
                    f->metrics_file = v;
                    return CheckAbsolutePath("metrics file", v);
                  }),
      cl.AddValue("--metrics_interval",
                  [f](const std::string& v) {
                    f->metrics_interval_given = true;
                    return ParseMetricsInterval(v, &f->metrics_interval_s);
                  }),
  };
}

std::vector<std::string> ServerFlagArgs(const std::vector<CLI::Option*>& given) {
  std::vector<std::string> args;
  for (const CLI::Option* o : given) {
    if (o->count() == 0) continue;
    args.push_back(o->get_name() + "=" + o->results().back());
  }
  return args;
}

Status CheckServerFlags(const ServerFlags& f) {
  if (f.metrics_interval_given && f.metrics_file.empty()) {
    return Status::InvalidArgument(
        "--metrics_interval sets how often --metrics_file is rewritten, and no "
        "--metrics_file is given: add --metrics_file PATH, or leave --metrics_interval "
        "out");
  }
  Status s = CheckMemoryCap(f.memory_cap_ratio, f.memory_cap_bytes);
  if (s.ok() && !f.spill_dir.empty()) s = CheckSpillDir(f.spill_dir);
  if (s.ok() && !f.metrics_file.empty()) s = CheckMetricsFile(f.metrics_file);
  return s;
}

}  // namespace shmcache
