// NumaTopology: how many NUMA nodes this host has, which node a CPU or the
// calling thread is on, and binding memory to a node.
//
// The topology can be injected for tests: SHMCACHE_NUMA_NODES=N makes the
// host look like N nodes (CPU c on node c % N; memory binding is skipped,
// since the nodes are not real). SHMCACHE_NUMA_NODE=k pins the calling
// process's idea of its own node to k.
//
// Thread safety: Get() is safe from any thread; the object is immutable
// except for ForceCurrentNode.
#pragma once

#include <atomic>
#include <cstddef>
#include <vector>

namespace shmcache {

class NumaTopology {
 public:
  static NumaTopology& Get();

  int num_nodes() const { return num_nodes_; }
  bool injected() const { return injected_; }
  // Node of the calling thread: the forced node if set, else its CPU's.
  // No system call (sched_getcpu reads the rseq area).
  int CurrentNode() const;
  int NodeOfCpu(int cpu) const;
  std::vector<int> CpusOfNode(int node) const;
  // Binds [addr, addr+len) to `node` (MPOL_BIND). No-op on an injected or
  // single-node topology, or when built without libnuma.
  void BindMemory(void* addr, size_t len, int node) const;
  // Pins the calling thread to the CPUs of `node`; false if that failed.
  bool PinThreadToNode(int node) const;
  // -1 restores the CPU-based answer.
  void ForceCurrentNode(int node) { forced_node_.store(node); }

 private:
  NumaTopology();
  int num_nodes_ = 1;
  bool injected_ = false;
  int num_cpus_ = 1;
  std::vector<int> cpu_node_;
  std::atomic<int> forced_node_{-1};
};

}  // namespace shmcache
