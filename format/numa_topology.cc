#include "format/numa_topology.h"

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "format/parse_number.h"

#ifdef SHMCACHE_HAVE_NUMA
#include <numa.h>
#include <numaif.h>
#endif

namespace shmcache {

static int EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  long n = 0;
  return ParseDecimal(v, 0, 1024, &n) ? static_cast<int>(n) : fallback;
}

NumaTopology& NumaTopology::Get() {
  static NumaTopology* topology = new NumaTopology();
  return *topology;
}

NumaTopology::NumaTopology() {
  num_cpus_ = static_cast<int>(sysconf(_SC_NPROCESSORS_CONF));
  if (num_cpus_ < 1) num_cpus_ = 1;
  cpu_node_.assign(static_cast<size_t>(num_cpus_), 0);
  int fake = EnvInt("SHMCACHE_NUMA_NODES", 0);
  if (fake > 0) {
    injected_ = true;
    num_nodes_ = fake;
    for (int c = 0; c < num_cpus_; ++c) cpu_node_[c] = c % fake;
  } else {
#ifdef SHMCACHE_HAVE_NUMA
    if (numa_available() >= 0) {
      num_nodes_ = numa_max_node() + 1;
      for (int c = 0; c < num_cpus_; ++c) {
        int n = numa_node_of_cpu(c);
        cpu_node_[c] = n < 0 ? 0 : n;
      }
    }
#endif
  }
  forced_node_.store(EnvInt("SHMCACHE_NUMA_NODE", -1));
}

int NumaTopology::NodeOfCpu(int cpu) const {
  if (cpu < 0 || cpu >= num_cpus_) return 0;
  return cpu_node_[static_cast<size_t>(cpu)];
}

int NumaTopology::CurrentNode() const {
  int forced = forced_node_.load(std::memory_order_relaxed);
  if (forced >= 0) return forced % num_nodes_;
  if (num_nodes_ == 1) return 0;
  return NodeOfCpu(sched_getcpu());
}

std::vector<int> NumaTopology::CpusOfNode(int node) const {
  std::vector<int> cpus;
  for (int c = 0; c < num_cpus_; ++c) {
    if (cpu_node_[static_cast<size_t>(c)] == node) cpus.push_back(c);
  }
  return cpus;
}

void NumaTopology::BindMemory(void* addr, size_t len, int node) const {
#ifdef SHMCACHE_HAVE_NUMA
  if (injected_ || num_nodes_ <= 1 || node < 0 || node >= num_nodes_) return;
  unsigned long mask[16] = {};
  mask[node / 64] = 1UL << (node % 64);
  // Failure leaves the default policy: slower, never wrong.
  (void)mbind(addr, len, MPOL_BIND, mask, sizeof(mask) * 8, 0);
#else
  (void)addr;
  (void)len;
  (void)node;
#endif
}

bool NumaTopology::PinThreadToNode(int node) const {
  std::vector<int> cpus = CpusOfNode(node);
  if (cpus.empty()) return false;
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) CPU_SET(c, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0;
}

}  // namespace shmcache
