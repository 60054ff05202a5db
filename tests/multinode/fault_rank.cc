// One rank of a launched job for the launcher tests (launched_faults_test.py):
// joins the job through env:// (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT and
// TP_JOB_ID from the environment, as tools/tprun sets them), all-reduces a
// few times, and on rank FAULTY does FAULT where its third collective is due:
//
//   fault_rank FAULT FAULTY TIMEOUT_MS
//
//   none        nothing: every rank finishes, exit 0
//   throw       throws a tp::Error of its own (a Cause)
//   unwritable  the same, with a directory where every rank's TP_ERROR_FILE
//               goes, so no rank can write its error file (as on a full
//               disk): the ranks that only lose their peer cannot say so
//   spin        computes forever, outside any collective
//   stop        stops itself (SIGSTOP), outside any collective
//   barrier     calls a barrier where the others all-reduce
//   size        all-reduces 9 elements there where the others all-reduce 8
//   skip        leaves that all-reduce out: its next one pairs with the
//               others' third, and every sum is wrong from there on; each
//               all-reduce is a step here, whose end compares the ranks'
//               collective counts, as the kit's trainer does
//
// Like a demo under a launcher, it shows its waits to tprun
// (report_to_launcher) and records its error (record_error).
#include <signal.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tensorplay/distributed/init.h"
#include "tensorplay/distributed/process_group.h"
#include "tensorplay/error.h"
#include "tensorplay/multiprocessing/launched_rank.h"
#include "tensorplay/tensor.h"

namespace dist = tp::distributed;

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: fault_rank none|throw|unwritable|spin|stop|barrier|size|skip FAULTY "
                         "TIMEOUT_MS\n");
    return 2;
  }
  const std::string fault = argv[1];
  const int faulty = std::atoi(argv[2]);
  const std::chrono::milliseconds timeout(std::atoi(argv[3]));
  tp::multiprocessing::report_to_launcher();
  if (fault == "unwritable") ::mkdir(std::getenv("TP_ERROR_FILE"), 0755);
  try {
    dist::init_process_group("gloo", "env://", timeout);
    const bool me = dist::get_rank() == faulty;
    tp::Tensor t = tp::ones({8});
    for (int i = 1; i <= 5; ++i) {
      if (me && i == 3) {
        if (fault == "throw" || fault == "unwritable") {
          throw tp::Error("planted fault: rank " + std::to_string(faulty) + " threw");
        }
        if (fault == "spin") {
          volatile unsigned long n = 0;
          for (;;) n = n + 1;
        }
        if (fault == "stop") ::raise(SIGSTOP);
        if (fault == "barrier") dist::barrier();
      }
      if (me && i == 3 && fault == "size") dist::all_reduce(tp::ones({9}));
      if (!me || i != 3 || (fault != "barrier" && fault != "skip" && fault != "size")) {
        dist::all_reduce(t);
      }
      dist::default_group()->check_collective_count("the end of step " + std::to_string(i));
    }
    dist::destroy_process_group();
  } catch (const std::exception& e) {
    tp::multiprocessing::record_error(e);
    std::fprintf(stderr, "fault_rank: %s\n", e.what());
    return 1;
  }
  return 0;
}
