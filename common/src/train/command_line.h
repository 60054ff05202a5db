// The command lines of the demos and checkers, through CLI11: the value
// checks they share, and parsing that ends the program the kit's way.
// Private to train/ (src/train/); the flags themselves are declared where
// they belong (demo_command_line.cc, checker.cc, and each stage's stage.h).
//
// Contract:
//   - use_kit_defaults() is where every command line starts: a flag given twice
//     keeps its last value (as the kit's parsers always did), and unknown
//     flags are left for parse_or_exit to name.
//   - The value checks are CLI11 transforms: each returns "" or what is
//     wrong with the text, in the words "expects a whole number from 1 to
//     64, got '0'" (CLI11 puts the flag's name in front), and rewrites a good
//     value in the plain form CLI11 then converts ("1e1" -> "10"), so what
//     the check accepted is what the flag gets.
//   - parse_or_exit() returns only when the command line is good: --help
//     prints usage (generated from the declarations) and exits 0; a bad value,
//     a missing one ("--steps needs a value: a whole number from 1 to
//     100000", the flag's own check saying what it takes) or an unknown flag
//     (with the nearest known one as a suggestion) goes to usage_error.
//   - usage_error() prints "PREFIX: problem" and a pointer to --help on
//     stderr, and exits 2: the kit's one shape of usage error.
#pragma once

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace tp::train::cli {

// Gives `app` the kit's ways (see the contract); call it before adding flags.
void use_kit_defaults(CLI::App& app);

// A whole number in [low, high] (a transform: see the contract).
CLI::Validator whole_number(int64_t low, int64_t high);
// A comma-separated list of whole numbers, each in [low, high] ("6,4,2").
CLI::Validator whole_numbers(int64_t low, int64_t high);
std::vector<std::string> split_commas(const std::string& list);
// A finite number in [low, high] (`low_open`: above low, not equal to it).
CLI::Validator number_in(double low, double high, bool low_open = false);
// A path to write: not empty, and not a flag (`--json --steps 3` would
// otherwise write a file named "--steps").
CLI::Validator file_name();

// "(default 25)", "(default 0.05)": a default as --help shows it.
std::string default_text(double value);

// A flag whose value is one of a few names, each standing for a value of
// type T: the list of choices is the one place they are spelled. --help
// shows them, and as the default the one `target` holds now.
template <typename T>
void add_choice(CLI::App& app, const std::string& name, const std::string& help,
                std::vector<std::pair<std::string, T>> choices, T& target) {
  add_choice<T>(app, name, help, std::move(choices), target, [&target](T value) { target = value; });
}

// The same, for a choice that is not a variable: `set` gets the value
// chosen; `initial` is the default --help shows.
template <typename T>
void add_choice(CLI::App& app, const std::string& name, const std::string& help,
                std::vector<std::pair<std::string, T>> choices, const T& initial,
                std::function<void(T)> set) {
  std::vector<std::string> names;
  std::string listed;  // "mini, branchy or deep"
  std::string initial_name;
  for (size_t i = 0; i < choices.size(); ++i) {
    names.push_back(choices[i].first);
    listed += (i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ") + choices[i].first;
    if (choices[i].second == initial) initial_name = choices[i].first;
  }
  app.add_option_function<std::string>(
         name,
         [set = std::move(set), choices](const std::string& text) {
           for (const auto& [n, value] : choices) {
             if (n == text) set(value);
           }
         },
         help + ": " + listed + (initial_name.empty() ? "" : " (default " + initial_name + ")"))
      ->type_name("NAME")
      ->check(CLI::Validator(
          [names, listed](std::string& text) -> std::string {
            if (std::find(names.begin(), names.end(), text) != names.end()) return "";
            return "expects " + listed + ", got '" + text + "'";
          },
          ""));
}

// A number flag that writes `target`, checked (and made plain) by `check`;
// --help shows `target`'s value now as the default.
template <typename T>
CLI::Option* add_number(CLI::App& app, const std::string& name, T& target,
                        const std::string& value_name, const std::string& help,
                        const CLI::Validator& check) {
  return app.add_option(name, target, help + " " + default_text(static_cast<double>(target)))
      ->type_name(value_name)
      ->transform(check);
}

// Parses argv into `app`'s flags, or exits as the contract says. `prefix`
// starts every error line ("demo 05", "checker").
void parse_or_exit(CLI::App& app, int argc, char** argv, const std::string& prefix);

[[noreturn]] void usage_error(const std::string& prefix, const std::string& problem);

}  // namespace tp::train::cli
