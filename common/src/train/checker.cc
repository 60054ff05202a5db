// The non-template half of the stage checker (see checker.h).
#include "tensorplay/train/checker.h"

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>

#include "tensorplay/error.h"

namespace tp::train {

std::vector<RunConfig> standard_configs() {
  std::vector<RunConfig> configs;
  auto add = [&](int world_size, Dtype dtype, bool per_rank_seed, double momentum) {
    RunConfig c;
    c.world_size = world_size;
    c.dtype = dtype;
    c.per_rank_seed = per_rank_seed;
    c.momentum = momentum;
    c.steps = 6;
    configs.push_back(c);
  };
  // The smallest real group first: per-rank seeds test the broadcast, and a
  // wrong value shows up as a difference between ranks, which names the cause
  // better than a collective count does.
  add(2, kFloat32, true, 0.0);
  add(1, kFloat32, false, 0.0);  // one rank: DDP must change nothing
  add(3, kFloat64, true, 0.0);   // an odd world size: 1/3 is not exact in binary
  add(4, kFloat32, true, 0.0);
  add(4, kFloat64, false, 0.9);  // momentum carries state across steps
  return configs;
}

std::vector<Finding> check_sync_between_backward_and_step(const std::vector<RankResult>& ranks) {
  std::vector<Finding> out;
  for (const RankResult& r : ranks) {
    int64_t step = -1;
    int64_t steps_seen = 0;
    uint64_t backward_end = 0, optimizer_begin = 0;
    std::vector<const trace::Event*> allreduces;  // spans of the current step
    // Returns false (after recording a finding) when step `step` breaks the order.
    auto step_ok = [&]() {
      const auto where = detail::cat("rank ", r.rank, ", step ", step);
      const auto counted = static_cast<size_t>(step) < r.allreduces_per_step.size()
                               ? r.allreduces_per_step[static_cast<size_t>(step)]
                               : allreduces.size();
      if (allreduces.size() != counted) {
        out.push_back({detail::cat(where, ": ", counted, " all-reduces were issued but ",
                                   allreduces.size(), " ran before the step ended"),
                       "wait() for every all-reduce in sync_grads before returning"});
        return false;
      }
      for (const trace::Event* a : allreduces) {
        if (a->begin_order < backward_end) {
          out.push_back({where + ": an all-reduce started before backward finished",
                         "call sync_grads() after loss.backward(): the gradients are not final "
                         "before"});
          return false;
        }
        // end_order 0: the span never ended, the collective was still running.
        if (optimizer_begin == 0 || a->end_order == 0 || a->end_order > optimizer_begin) {
          out.push_back({where + ": an all-reduce was still running when the optimizer step began",
                         "wait() for every all-reduce in sync_grads: the optimizer must read "
                         "averaged gradients"});
          return false;
        }
      }
      return true;
    };
    for (const trace::Event& e : r.events) {
      if (e.name == "step") {
        if (step >= 0 && !step_ok()) return out;
        step = e.args.empty() ? step + 1 : e.args[0].second;
        ++steps_seen;
        backward_end = optimizer_begin = 0;
        allreduces.clear();
      } else if (e.name == "backward") {
        backward_end = e.end_order;
      } else if (e.name == "optimizer") {
        optimizer_begin = e.begin_order;
      } else if (e.name == "allreduce" && e.phase == 'X' && step >= 0) {
        allreduces.push_back(&e);
      }
    }
    if (step >= 0 && !step_ok()) return out;
    // An empty trace would pass every check above: say so instead.
    if (steps_seen != static_cast<int64_t>(r.losses.size())) {
      out.push_back({detail::cat("rank ", r.rank, ": the trace shows ", steps_seen,
                                 " training steps, the run had ", r.losses.size()),
                     "the order checks need RunConfig::trace on every rank"});
      return out;
    }
  }
  return out;
}

void CheckerRun::print(const std::string& text) {
  std::fputs(text.c_str(), stdout);
  std::fflush(stdout);
  report += text;
}

CheckerRun parse_checker_args(int argc, char** argv) {
  CheckerRun run;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "checker: %s needs a value\n", arg.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--expect-fail") {
      run.expect_file = value();
    } else if (arg == "--only") {
      const std::string text = value();
      char* end = nullptr;
      const long n = std::strtol(text.c_str(), &end, 10);
      if (text.empty() || *end != '\0' || n < 0) {
        std::fprintf(stderr, "checker: --only expects a config number (see --list), got '%s'\n",
                     text.c_str());
        std::exit(2);
      }
      run.only = static_cast<int>(n);
    } else if (arg == "--list") {
      run.list = true;
    } else {
      std::fprintf(stderr,
                   "checker: unknown argument '%s'\n"
                   "usage: %s [--list] [--only N] [--expect-fail MUTANT_FILE]\n",
                   arg.c_str(), argv[0]);
      std::exit(2);
    }
  }
  return run;
}

Finding finding_from_spawn_error(const std::string& stage, const std::exception& error) {
  std::string message = error.what();
  std::string cause;
  if (message.find("not implemented yet") != std::string::npos) {
    cause = "this is still the exercise stub: fill in the function the message names (./kit "
            "reset " + stage + " restores the stubs)";
  } else if (message.find("timed out") != std::string::npos) {
    cause = "a rank waits in a collective that another rank never issued: every rank must "
            "issue the same collectives in the same order";
  } else {
    cause = "a rank threw: its message above says why";
  }
  return {message, cause};
}

int finish_checker(CheckerRun& run, const CheckerSpec& spec, bool passed) {
  if (run.expect_file.empty()) {
    if (!passed) {
      run.print("stage " + spec.stage + ": FAILED (see above)\n");
    } else if (run.only >= 0) {
      run.print(detail::cat("stage ", spec.stage, ": configuration ", run.only,
                            " matches the reference (the others were not run)\n"));
    } else {
      run.print("stage " + spec.stage + ": every configuration matches the reference\n");
    }
    return passed ? 0 : 1;
  }
  std::ifstream in(run.expect_file);
  if (!in) {
    std::fprintf(stderr, "checker: cannot read mutant file %s\n", run.expect_file.c_str());
    return 2;
  }
  std::vector<std::string> phrases;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("expect:", 0) == 0) {
      std::string phrase = line.substr(7);
      phrase.erase(0, phrase.find_first_not_of(' '));
      phrases.push_back(phrase);
    }
  }
  if (phrases.empty()) {
    std::fprintf(stderr, "checker: %s has no 'expect:' line\n", run.expect_file.c_str());
    return 2;
  }
  if (passed) {
    run.print("planted bug NOT caught: the checker passed a wrong DDP (" + run.expect_file + ")\n");
    return 1;
  }
  for (const std::string& phrase : phrases) {
    if (run.report.find(phrase) == std::string::npos) {
      run.print("planted bug caught, but the report lacks the expected diagnosis \"" + phrase +
                "\" (" + run.expect_file + ")\n");
      return 1;
    }
  }
  run.print("planted bug caught with the expected diagnosis (" + run.expect_file + ")\n");
  return 0;
}

}  // namespace tp::train
