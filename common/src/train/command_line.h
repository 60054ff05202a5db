// The command lines of the demos and checkers, through CLI11: the value
// checks they share, and parsing that ends the program the kit's way.
// Private to train/ (src/train/); the flags themselves are declared where
// they belong (demo.cc, checker.cc, and each stage's stage.h).
//
// Contract:
//   - Every check returns "" or what is wrong with the text, in the words
//     "expects a whole number from 1 to 64, got '0'"; CLI11 puts the flag's
//     name in front.
//   - parse_or_exit() returns only when the command line is good: --help
//     prints usage (generated from the declarations) and exits 0; a bad value,
//     a missing one or an unknown flag (with the nearest known one as a
//     suggestion) prints "PREFIX: what is wrong" and exits 2.
#pragma once

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace tp::train::cli {

// A whole number in [low, high].
CLI::Validator whole_number(int64_t low, int64_t high);
// A comma-separated list of whole numbers, each in [low, high] ("6,4,2").
CLI::Validator whole_numbers(int64_t low, int64_t high);
std::vector<std::string> split_commas(const std::string& list);
// A finite number in [low, high] (`low_open`: above low, not equal to it).
CLI::Validator number_in(double low, double high, bool low_open = false);

// A flag whose value is one of a few names, each standing for a value of
// type T: the names list is the one place they are spelled.
template <typename T>
inline void add_choice(CLI::App& app, const std::string& name, const std::string& help,
                std::vector<std::pair<std::string, T>> choices, T& target) {
  std::vector<std::string> names;
  for (const auto& choice : choices) names.push_back(choice.first);
  std::string listed;  // "mini, branchy or deep"
  for (size_t i = 0; i < names.size(); ++i) {
    listed += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  }
  app.add_option_function<std::string>(
         name,
         [&target, choices](const std::string& text) {
           for (const auto& [n, value] : choices) {
             if (n == text) target = value;
           }
         },
         help + ": " + listed)
      ->type_name("NAME")
      ->check(CLI::Validator(
          [names, listed](std::string& text) -> std::string {
            if (std::find(names.begin(), names.end(), text) != names.end()) return "";
            return "expects " + listed + ", got '" + text + "'";
          },
          ""));
}

// Parses argv into `app`'s flags, or exits as the contract says. `prefix`
// starts every error line ("demo 05", "checker").
void parse_or_exit(CLI::App& app, int argc, char** argv, const std::string& prefix);

}  // namespace tp::train::cli
