#include "process_state.h"

#include <signal.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fmt/format.h>

#include "parse_number.h"

namespace shmcache {

bool ProcessGone(int pid) {
  if (pid <= 0) return true;
  if (kill(pid, 0) != 0 && errno == ESRCH) return true;
  FILE* f = fopen(fmt::format("/proc/{}/status", pid).c_str(), "r");
  if (f == nullptr) return true;
  char line[256];
  char state = 'R';
  long threads = 1;
  while (fgets(line, sizeof line, f)) {
    if (std::strncmp(line, "State:", 6) == 0) {
      std::sscanf(line + 6, " %c", &state);
    } else if (std::strncmp(line, "Threads:", 8) == 0) {
      LeadingLong(line + 8, &threads);
    }
  }
  fclose(f);
  return (state == 'Z' || state == 'X') && threads <= 1;
}

}  // namespace shmcache
