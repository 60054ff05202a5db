// The non-template half of the stage checker (see checker.h).
#include "tensorplay/train/checker.h"

#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>

#include "command_line.h"
#include "tensorplay/distributed/process_group_gloo.h"
#include "tensorplay/error.h"
#include "tensorplay/util/temp_dir.h"

namespace tp::train {

namespace {
// Far above the few hundred collectives the kit's scenarios issue.
constexpr uint64_t kScenarioCollectiveBudget = 10000;
}  // namespace

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

void CheckerRun::print(const std::string& text) {
  report += text;
  if (quiet) return;
  std::fputs(text.c_str(), stdout);
  std::fflush(stdout);
}

CheckerRun parse_checker_args(int argc, char** argv) {
  CheckerRun run;
  CLI::App app("A stage's checker: trains it against the reference in every case, then runs "
               "its scenarios, and explains the first failure.",
               argc > 0 ? argv[0] : "checker");
  cli::use_kit_defaults(app);
  app.add_flag("--list", run.list, "list the cases, scenarios and worker cases, numbered");
  app.add_option("--only", run.only, "run that one alone (a number from --list)")
      ->type_name("N")
      ->transform(cli::whole_number(0, INT_MAX));
  app.add_option("--repeat", run.repeat, "run the whole check N times; stop at the first miss")
      ->type_name("N")
      ->transform(cli::whole_number(1, 1000));
  app.add_option("--expect-fail", run.expect_file,
                 "a planted bug's mutant file: the check must fail with its expect: lines")
      ->type_name("MUTANT_FILE");
  app.add_option("--init-method", run.init_method,
                 "one rank of a job a launcher started (env://, tcp://, redis://)")
      ->type_name("URL");
  cli::add_choice<Device>(app, "--device", "where every case's ranks train (default cpu)",
                          {{"cpu", kCPU}, {"cuda", Device{DeviceType::CUDA, -1}}}, run.device);
  int64_t timeout_ms = run.collective_timeout.count();
  app.add_option("--collective-timeout", timeout_ms,
                 "how long a rank waits in one collective (and at rendezvous) before it is a "
                 "hang, in ms (default " + std::to_string(timeout_ms) + ")")
      ->type_name("MS")
      ->transform(cli::whole_number(100, 3600000));
  cli::parse_or_exit(app, argc, argv, "checker");
  run.collective_timeout = std::chrono::milliseconds(timeout_ms);
  // A buffer read before it is written (made with empty(), never zeroed)
  // then shows as NaN on every machine, not as what the allocator left.
  set_fill_uninitialized_memory(true);
  if (const std::string mistake = launch_mistake("the checker", run.init_method); !mistake.empty()) {
    cli::usage_error("checker", mistake);
  }
  return run;
}

Finding finding_from_error(const std::string& stage, const std::exception& error,
                           const std::string& if_a_rank_throws) {
  const std::string message = error.what();
  // The kind, not the wording, says what happened (ErrorKind in error.h);
  // spawn reports the kind of the failure it blames.
  ErrorKind kind = ErrorKind::Cause;
  bool from_a_rank = false;
  // A job without progress: where its ranks were, which the cause must fit.
  multiprocessing::Hang hang = multiprocessing::Hang::kNone;
  if (const auto* spawn_error = dynamic_cast<const multiprocessing::SpawnError*>(&error)) {
    kind = spawn_error->kind();
    hang = spawn_error->hang();
    from_a_rank = true;
  } else if (const auto* tp_error = dynamic_cast<const Error*>(&error)) {
    kind = tp_error->kind();
  }
  switch (kind) {
    case ErrorKind::Stub:
      return {message, "this is still the exercise stub: fill in the function the message "
                       "names (./kit reset " + stage + " restores the stubs)"};
    case ErrorKind::Timeout:
      switch (hang) {
        case multiprocessing::Hang::kNoneInCollective:
          return {message, "no rank was in a collective, so none was waiting for another: "
                           "every rank was busy outside collectives, in a loop that never "
                           "ends (in a comm hook, or elsewhere in the step), or waiting on "
                           "something other than its peers"};
        case multiprocessing::Hang::kRankStopped:
          return {message, "a rank was stopped (SIGSTOP), so it never joined a collective: "
                           "continue it (kill -CONT) or end it"};
        case multiprocessing::Hang::kAllInCollective:
          return {message, "every rank waited in a collective and none completed: they wait "
                           "in different ones, so a rank skipped a collective or issued an "
                           "extra one: every rank must issue the same collectives in the same "
                           "order"};
        case multiprocessing::Hang::kNone:  // a collective timed out on a rank
        case multiprocessing::Hang::kSomeInCollective:
          break;
      }
      return {message, "a rank waits in a collective that another rank never issued: every "
                       "rank must issue the same collectives in the same order"};
    case ErrorKind::Consequence:
      return {message, "a rank failed because another rank failed or left first; no rank "
                       "reported a cause of its own: did a rank return or exit early?"};
    case ErrorKind::Cause:
      break;
  }
  if (!from_a_rank) return {message, "the checker could not run this case: the message says why"};
  // spawn's own words for a rank that died by a signal (spawn.h): the kind
  // (a Cause) cannot tell a crash from a rank's own error, the report can.
  if (message.find("failed: killed by signal") != std::string::npos) {
    return {message, "a rank crashed (killed by a signal), for example on a null pointer or "
                     "an index out of range: run this case alone with --only N under gdb "
                     "(gdb -ex 'set follow-fork-mode child' --args ..., as the ranks are "
                     "forked)"};
  }
  if (!if_a_rank_throws.empty()) return {message, if_a_rank_throws};
  return {message, "a rank failed: its message above says why and what to change"};
}

int end_launched_rank(distributed::ProcessGroup& launched, const std::string& description,
                      const std::exception& error) {
  multiprocessing::record_error(error);
  std::fprintf(stderr, "checker: rank %d: %s: %s\n", launched.rank(), description.c_str(),
               error.what());
  distributed::destroy_process_group();
  return 1;
}

int finish_pass(CheckerRun& run, const std::string& stage,
                const distributed::ProcessGroup* launched, const PassTally& tally) {
  if (launched != nullptr && tally.ran == 0) {
    // A checker that judged nothing must not say PASS.
    std::fprintf(stderr, "checker: rank %d: nothing to check: %s this job's world size %d "
                 "(see --list; the cases' world sizes are in their descriptions); run another "
                 "world size, or the checker without --init-method\n", launched->rank(),
                 run.only >= 0 ? "--only's case, scenario or worker case cannot run at"
                               : "no case has", launched->size());
    return 2;
  }
  if (run.device != kCPU && launched == nullptr) {
    if (tally.ran == 0) {
      std::fprintf(stderr, "checker: --device cuda: nothing to check: --only names a scenario "
                   "or worker case, which run on the CPU only\n");
      return 2;
    }
    if (tally.skipped > 0) {
      run.print(detail::cat(tally.skipped, " scenarios and worker cases skipped: they run on "
                            "the CPU only (run the checker without --device for those)\n"));
    }
  }
  if (launched == nullptr) return finish_checker(run, stage, tally.passed);
  run.print(detail::cat(tally.skipped, " cases, scenarios and worker cases skipped: they need "
                        "another world size than this job's ", launched->size(), ", or ranks "
                        "of their own (run the checker without --init-method for those)\n"));
  if (run.quiet) {
    std::printf("checker: rank %d: done; rank 0 prints the report\n", launched->rank());
  }
  const int code = finish_checker(run, stage, tally.passed);
  // What tprun shows as this rank's error (the report is on stdout).
  if (code != 0) std::fprintf(stderr, "checker: stage %s FAILED: see rank 0's report\n",
                              stage.c_str());
  return code;
}

std::vector<Finding> run_scenario(const std::string& stage, const Scenario& scenario,
                                  std::chrono::milliseconds collective_timeout) {
  // As run_ddp: a fresh rendezvous, the default plan's job timeout and the
  // run's collective timeout, so a rank that hangs in a collective becomes
  // a finding naming it.
  TempDir rendezvous("tensorplay-rdzv");
  multiprocessing::SpawnOptions options;
  options.timeout = RunConfig{}.job_timeout;
  std::vector<std::string> facts;
  try {
    facts = multiprocessing::spawn(
        options,
        [&](int rank) -> std::string {
          auto group = std::make_shared<distributed::ProcessGroupGloo>(
              rendezvous.path(), rank, scenario.world_size,
              distributed::GlooOptions{collective_timeout,
                                       /*check_in_flight_writes=*/true});
          // A scenario drives a few steps by hand: this bounds a loop that
          // never stops issuing collectives (Note [Collective budget]).
          group->set_collective_budget(kScenarioCollectiveBudget,
                                       "a scenario drives a few steps");
          return scenario.run(rank, group);
        },
        scenario.world_size);
  } catch (const std::exception& error) {
    return {finding_from_error(stage, error, scenario.if_a_rank_throws)};
  }
  // Each rank's fact, the scenario's likely cause once: it is the same for
  // every rank.
  std::vector<Finding> out;
  for (const std::string& fact : facts) {
    if (!fact.empty()) out.push_back({fact, out.empty() ? scenario.likely_cause : "as above"});
  }
  return out;
}

void report_case(CheckerRun& run, const std::string& description,
                 const std::vector<Finding>& findings, const Comparison* comparison) {
  if (!findings.empty()) {
    run.first_cause = findings.front().what + "\n" + findings.front().likely_cause;
    run.print("FAIL  " + description + "\n" + format_findings(findings));
    return;
  }
  if (comparison == nullptr) {
    run.print("PASS  " + description + "\n");
    return;
  }
  char line[512];
  std::snprintf(line, sizeof line, "PASS  %s\n      max |loss diff| %.1e, max |param diff| %.1e\n",
                description.c_str(), comparison->max_loss_diff, comparison->final_params.max_abs);
  run.print(line);
}

int finish_checker(CheckerRun& run, const std::string& stage, bool passed) {
  if (run.expect_file.empty()) {
    if (!passed) {
      run.print("stage " + stage + ": FAILED (see above)\n");
    } else if (run.only >= 0) {
      run.print(detail::cat("stage ", stage, ": case ", run.only,
                            " matches the reference (the others were not run)\n"));
    } else {
      run.print("stage " + stage + ": every case matches the reference\n");
    }
    return passed ? 0 : 1;
  }
  std::ifstream in(run.expect_file);
  if (!in) {
    std::fprintf(stderr, "checker: cannot read mutant file %s\n", run.expect_file.c_str());
    return 2;
  }
  std::vector<std::string> phrases;        // anywhere in the report
  std::vector<std::string> first_phrases;  // in the first finding
  for (std::string line; std::getline(in, line);) {
    for (auto [tag, list] :
         {std::pair{"expect:", &phrases}, std::pair{"expect-first:", &first_phrases}}) {
      const std::string prefix = tag;
      if (line.rfind(prefix, 0) != 0) continue;
      std::string phrase = line.substr(prefix.size());
      phrase.erase(0, phrase.find_first_not_of(' '));
      list->push_back(phrase);
    }
  }
  if (phrases.empty() && first_phrases.empty()) {
    std::fprintf(stderr, "checker: %s has no 'expect:' or 'expect-first:' line\n",
                 run.expect_file.c_str());
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
  for (const std::string& phrase : first_phrases) {
    if (run.first_cause.find(phrase) == std::string::npos) {
      run.print("planted bug caught, but the first finding does not name the expected cause \"" +
                phrase + "\" (" + run.expect_file + ")\n");
      return 1;
    }
  }
  run.print("planted bug caught with the expected diagnosis (" + run.expect_file + ")\n");
  return 0;
}

}  // namespace tp::train
