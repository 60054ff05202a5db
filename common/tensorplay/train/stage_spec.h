// What a DDP stage is, declared once: its number and title, the options it
// takes with their command-line flags, and its words for the checker's
// advice. The lesson's demo (demo.h), the stage's checker (checker.h) and
// the benchmarks all read it, so none of them repeats a title, an advice
// line or a flag.
//
// Contract:
//   - Each stage declares `stageNN::stage_spec()` in solutions/NN-topic/stage.h,
//     beside ddp.h, whose DistributedDataParallel declares the stage's
//     Capabilities (capabilities.h). The capabilities stay on the class
//     because the compiler checks them (the concept DataParallelModel in
//     ddp_trainer.h); the spec is what people read: names, words, flags.
//   - A flag sets one member of the run's options (run_options_t<D>,
//     below: the stage's Options, or its RunOptions): a number within
//     [low, high] (`--bucket-cap-mb 0.5`), a switch (`--static-graph`), or
//     one of a list of names (`--comm-hook fp16`; an enum's, `--sharding
//     full`, through enum_flag).
//     A few must also change the plan the reference follows
//     (`--no-broadcast-buffers`: the reference keeps each rank's buffers
//     too); `plan` does that. A flag is declared once, here or in the
//     stage's stage.h; the demo turns each into a command-line option with
//     its help line, so usage is generated from these declarations.
//   - `adapt`, when set, makes the options agree with a plan set by the
//     demo's shared flags (stage 07: --divide-by-active-ranks is the plan's
//     divisor and the DDP's option at once).
//   - `check_plan`, when set, refuses options that cannot run the plan
//     (stage 09: a comm hook with the reduce-scatter form): the demo calls
//     it after `adapt`, before any rank starts, and exits 2 with its words.
//   - Plain data, built fresh by each stage_spec() call; not shared between
//     threads.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "tensorplay/error.h"
#include "tensorplay/nn/module.h"
#include "tensorplay/train/compare.h"
#include "tensorplay/train/config.h"

namespace tp::train {

// The options a run of stage D takes: what the demo's flags set, what a
// checker's case holds, what the kit's trainer hands on. By default the
// DDP's own Options. A stage whose harness reads more than the DDP does
// (which built-in comm hook to register, how its sharded optimizer syncs)
// declares in its stage.h a `RunOptions` deriving from Options, with those
// fields, and says so by specializing this template:
//
//   template <>
//   struct tp::train::RunOptionsOf<stage08::DistributedDataParallel> {
//     using type = stage08::RunOptions;
//   };
//
// so that the student's Options holds only what the DDP itself reads (as
// PyTorch's, its constructor's and join()'s arguments). The trainer builds
// the DDP from the Options part (the concept DataParallelModel in
// ddp_trainer.h checks that RunOptions derives from it) and hands the
// whole to the stage's functions in stage.h (register_builtin_hook,
// make_optimizer). The specialization goes in stage.h, beside RunOptions:
// every program that trains the stage includes stage.h, and a
// specialization must be seen before the template is first used. Forgotten,
// the trainer would pass plain Options, and register_builtin_hook (which
// takes RunOptions) would not compile.
template <typename D>
struct RunOptionsOf {
  using type = typename D::Options;
};
template <typename D>
using run_options_t = typename RunOptionsOf<D>::type;

// One command-line flag of a stage's own, setting a member of its options.
// A helper below binding a member of a base (Options) for a derived type
// (RunOptions) is called with the type named, `switch_flag<RunOptions>(...)`:
// the member pointer alone would deduce the base. (enum_flag then needs
// both, `enum_flag<RunOptions, E>`.)
template <typename Options>
struct OptionFlag {
  std::string name;  // "--bucket-cap-mb"
  std::string help;  // one line for --help
  // A number flag sets *number, a whole-number flag *whole_number (a rank,
  // a count), within [low, high]; a switch sets *toggle to `switch_to`; a
  // choice calls `choose`. Exactly one of the four is set (bind_flags
  // checks).
  double Options::*number = nullptr;
  int64_t Options::*whole_number = nullptr;
  double low = 0.0;
  double high = 0.0;
  bool Options::*toggle = nullptr;
  bool switch_to = true;
  // A choice flag takes one of `choices` (anything else is a usage error
  // listing them): `choose` sets the option by it, `chosen` names the
  // option's current value (choice_flag for a string, enum_flag for an
  // enum; a stage may write its own pair, for a policy say).
  std::vector<std::string> choices;
  std::function<void(Options&, const std::string&)> choose;
  std::function<std::string(const Options&)> chosen;
  // Also changes the plan, for a flag the reference must follow too.
  std::function<void(RunConfig&)> plan;
};

template <typename Options>
OptionFlag<Options> number_flag(std::string name, double Options::*member, double low,
                                double high, std::string help) {
  OptionFlag<Options> flag;
  flag.name = std::move(name);
  flag.help = std::move(help);
  flag.number = member;
  flag.low = low;
  flag.high = high;
  return flag;
}

// A count: anything but a whole number in [low, high] is a usage error
// naming the flag.
template <typename Options>
OptionFlag<Options> whole_number_flag(std::string name, int64_t Options::*member, int64_t low,
                                      int64_t high, std::string help) {
  OptionFlag<Options> flag;
  flag.name = std::move(name);
  flag.help = std::move(help);
  flag.whole_number = member;
  flag.low = static_cast<double>(low);
  flag.high = static_cast<double>(high);
  return flag;
}

template <typename Options>
OptionFlag<Options> switch_flag(std::string name, bool Options::*member, std::string help,
                                bool switch_to = true) {
  OptionFlag<Options> flag;
  flag.name = std::move(name);
  flag.help = std::move(help);
  flag.toggle = member;
  flag.switch_to = switch_to;
  return flag;
}

template <typename Options>
OptionFlag<Options> choice_flag(std::string name, std::string Options::*member,
                                std::vector<std::string> choices, std::string help) {
  OptionFlag<Options> flag;
  flag.name = std::move(name);
  flag.help = std::move(help);
  flag.choices = std::move(choices);
  flag.choose = [member](Options& options, const std::string& text) { options.*member = text; };
  flag.chosen = [member](const Options& options) { return options.*member; };
  return flag;
}

// A choice flag for an option that is not a string: `names` pairs each
// choice with the value it sets (enum_flag("--sharding", &Options::sharding_strategy,
// {{"full", FULL_SHARD}, ...}, help)).
template <typename Options, typename Value>
OptionFlag<Options> enum_flag(std::string name, Value Options::*member,
                              std::vector<std::pair<std::string, Value>> names, std::string help) {
  OptionFlag<Options> flag;
  flag.name = std::move(name);
  flag.help = std::move(help);
  for (const auto& [text, value] : names) flag.choices.push_back(text);
  flag.choose = [member, names, flag_name = flag.name](Options& options, const std::string& text) {
    for (const auto& [n, value] : names) {
      if (n == text) {
        options.*member = value;
        return;
      }
    }
    TP_THROW(Error, "tp::train: ", flag_name, " has no choice '", text, "'");
  };
  flag.chosen = [member, names](const Options& options) -> std::string {
    for (const auto& [n, value] : names) {
      if (options.*member == value) return n;
    }
    return "";
  };
  return flag;
}

// The flags several stages share, each declared here once.

// The two bucket caps, then `more` (the order --help lists them in). The
// caps' lowest value, 1e-9 MiB (about a thousandth of a byte), puts every
// parameter in a bucket of its own.
template <typename Options>
std::vector<OptionFlag<Options>> bucket_cap_flags(std::vector<OptionFlag<Options>> more = {}) {
  std::vector<OptionFlag<Options>> flags = {
      number_flag<Options>("--bucket-cap-mb", &Options::bucket_cap_mb, 1e-9, 1e6,
                           "cap of every bucket but the first, in MiB"),
      number_flag<Options>("--first-bucket-cap-mb", &Options::first_bucket_cap_mb, 1e-9, 1e6,
                           "cap of the first bucket, in MiB")};
  flags.insert(flags.end(), more.begin(), more.end());
  return flags;
}

template <typename Options>
OptionFlag<Options> gradient_as_bucket_view_flag() {
  return switch_flag<Options>("--gradient-as-bucket-view", &Options::gradient_as_bucket_view,
                              "make each .grad a view of its bucket slot (no copy back)");
}

template <typename Options>
OptionFlag<Options> find_unused_parameters_flag() {
  return switch_flag<Options>("--find-unused-parameters", &Options::find_unused_parameters,
                              "walk each forward's graph; let unused parameters complete "
                              "their buckets");
}

template <typename Options>
OptionFlag<Options> static_graph_flag() {
  return switch_flag<Options>("--static-graph", &Options::static_graph,
                              "find the unused parameters once, in the first iteration");
}

// The comm hook flags of the stages that offer PyTorch's built-in hooks
// (08 and 09): the hook by name, and PowerSGD's three knobs.
template <typename Options>
std::vector<OptionFlag<Options>> comm_hook_flags() {
  return {choice_flag<Options>("--comm-hook", &Options::comm_hook,
                               {"none", "allreduce", "fp16", "bf16", "powersgd"},
                               "the built-in comm hook to register"),
          whole_number_flag<Options>("--powersgd-rank", &Options::powersgd_rank, 1, 1000000,
                                     "PowerSGD's matrix approximation rank"),
          whole_number_flag<Options>("--powersgd-start-iteration",
                                     &Options::powersgd_start_iteration, 0, 1000000000,
                                     "iterations of plain all-reduce before PowerSGD starts"),
          number_flag<Options>("--powersgd-min-compression-rate",
                               &Options::powersgd_min_compression_rate, 0, 1e9,
                               "compress a matrix only if it shrinks more than this")};
}

// Throws tp::Error for a comm hook plan that cannot run or is a mistake, so
// that the demo refuses it before any rank starts (a usage error) rather
// than a rank failing a check inside the hook's set-up: PowerSGD's knobs
// given without PowerSGD (they would be ignored; a knob given at its
// default is not told apart); a PowerSGD rank above every weight's min(n,
// m) in the plan's model (every matrix would be sent whole: lesson 08 calls
// it a mistake, as register_builtin_hook's check in stage.h does); a hook with
// --divide-by-active-ranks (the hook decides what to divide by).
template <typename Options>
void check_comm_hook_plan(const RunConfig& config, const Options& options) {
  const Options defaults{};
  if (options.comm_hook != "powersgd" &&
      (options.powersgd_rank != defaults.powersgd_rank ||
       options.powersgd_start_iteration != defaults.powersgd_start_iteration ||
       options.powersgd_min_compression_rate != defaults.powersgd_min_compression_rate)) {
    TP_THROW(Error, "--powersgd-rank, --powersgd-start-iteration and "
             "--powersgd-min-compression-rate set PowerSGD's options, and the comm hook is '",
             options.comm_hook, "': add --comm-hook powersgd, or drop them");
  }
  if (options.comm_hook == "powersgd") {
    int64_t largest = 0;  // the largest min(n, m) of a weight viewed as an n x m matrix
    for (const Tensor& p : make_model(config)->parameters()) {
      if (p.dim() >= 2) largest = std::max(largest, std::min(p.size(0), p.numel() / p.size(0)));
    }
    if (largest > 0 && options.powersgd_rank > largest) {
      TP_THROW(Error, "--powersgd-rank ", options.powersgd_rank, " is above every weight's "
               "min(n, m) in this model (the largest is ", largest, "); a rank-", largest,
               " approximation already sends every weight whole");
    }
  }
  if (options.comm_hook != "none" && config.divisor == Divisor::ActiveRanks) {
    TP_THROW(Error, "--divide-by-active-ranks with --comm-hook ", options.comm_hook,
             ": the hook decides what to divide by (the built-in hooks divide by the world "
             "size), so the divisor would be silently ignored; drop one of the two");
  }
}

template <typename Options>
struct StageSpec {
  std::string number;  // "05": the folder's prefix, as in `./kit demo 05`
  std::string title;   // "DDP with find_unused_parameters"
  Advice advice;       // the stage's words in a diagnosis (compare.h)
  std::vector<OptionFlag<Options>> flags;
  std::function<void(const RunConfig&, Options&)> adapt;  // may be empty
  // May be empty. For options whose results are approximate by design (a
  // compressing comm hook), why, in a few words; "" where the options
  // promise the reference's numbers. The demo then reports how far the run
  // is from the reference instead of a verdict of "differs".
  std::function<std::string(const Options&)> approximation;
  // May be empty. Throws tp::Error naming what is wrong when the options,
  // as `adapt` left them, cannot run this plan (a comm hook the stage's
  // reduce-scatter form cannot take, say): the demo refuses the plan before
  // any rank starts.
  std::function<void(const RunConfig&, const Options&)> check_plan;
};

// A flag bound to one Options object: what the (non-template) command-line
// parser works with. `set` gets the parsed number (1 for a switch); a
// choice flag (choices not empty) calls `choose` with the name given.
struct BoundFlag {
  std::string name;
  std::string help;
  bool takes_number = false;
  double low = 0.0;
  double high = 0.0;
  bool whole = false;    // only whole numbers in [low, high]
  double initial = 0.0;  // a number's value before parsing: its default
  std::function<void(double value, RunConfig& config)> set;
  std::vector<std::string> choices;
  std::string initial_choice;  // a choice's value before parsing: its default
  std::function<void(const std::string& name, RunConfig& config)> choose;
};

// Binds each flag to `options`, which must outlive the result.
template <typename Options>
std::vector<BoundFlag> bind_flags(const std::vector<OptionFlag<Options>>& flags,
                                  Options& options) {
  std::vector<BoundFlag> out;
  for (const OptionFlag<Options>& f : flags) {
    const bool chooses = static_cast<bool>(f.choose);
    TP_CHECK((f.number != nullptr) + (f.whole_number != nullptr) + (f.toggle != nullptr) +
                     chooses ==
                 1,
             "tp::train::bind_flags: flag ", f.name, " must set exactly one member of the "
             "stage's Options (number, whole number, toggle or choice)");
    TP_CHECK(chooses == !f.choices.empty() && chooses == static_cast<bool>(f.chosen),
             "tp::train::bind_flags: flag ", f.name,
             " lists choices without choose and chosen, or the other way round");
    BoundFlag b;
    b.name = f.name;
    b.help = f.help;
    b.takes_number = f.number != nullptr || f.whole_number != nullptr;
    b.low = f.low;
    b.high = f.high;
    b.whole = f.whole_number != nullptr;
    b.initial = f.number != nullptr         ? options.*f.number
                : f.whole_number != nullptr ? static_cast<double>(options.*f.whole_number)
                                            : 0.0;
    if (chooses) {
      b.choices = f.choices;
      b.initial_choice = f.chosen(options);
      b.choose = [&options, f](const std::string& name, RunConfig& config) {
        f.choose(options, name);
        if (f.plan) f.plan(config);
      };
    }
    b.set = [&options, f](double value, RunConfig& config) {
      if (f.number != nullptr) {
        options.*f.number = value;
      } else if (f.whole_number != nullptr) {
        options.*f.whole_number = static_cast<int64_t>(value);  // whole: the parser checked
      } else {
        options.*f.toggle = f.switch_to;
      }
      if (f.plan) f.plan(config);
    };
    out.push_back(std::move(b));
  }
  return out;
}

}  // namespace tp::train
