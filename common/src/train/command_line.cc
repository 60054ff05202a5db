// The shared value checks and parse_or_exit (see command_line.h).
#include "command_line.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "tensorplay/error.h"

namespace tp::train::cli {

// Validators. Each returns "" or what is wrong with the text; CLI11 puts
// the flag's name in front ("--steps: expects a whole number ...").
CLI::Validator whole_number(int64_t low, int64_t high) {
  return CLI::Validator(
      [low, high](std::string& text) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        if (text.empty() || *end != '\0' || !std::isfinite(v) || v != std::floor(v) ||
            v < static_cast<double>(low) || v > static_cast<double>(high)) {
          return detail::cat("expects a whole number from ", low, " to ", high, ", got '", text,
                             "'");
        }
        return "";
      },
      "");
}

std::vector<std::string> split_commas(const std::string& list) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= list.size()) {
    const size_t comma = std::min(list.find(',', start), list.size());
    out.push_back(list.substr(start, comma - start));
    start = comma + 1;
  }
  return out;
}

// A comma-separated list of whole numbers, each in [low, high].
CLI::Validator whole_numbers(int64_t low, int64_t high) {
  return CLI::Validator(
      [low, high](std::string& list) -> std::string {
        for (std::string count : split_commas(list)) {
          if (const std::string problem = whole_number(low, high)(count); !problem.empty()) {
            return problem + " in '" + list + "'";
          }
        }
        return "";
      },
      "");
}

// A finite number in [low, high] (`low_open`: above low, not equal to it).
CLI::Validator number_in(double low, double high, bool low_open) {
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        const bool above_low = low_open ? v > low : v >= low;
        if (text.empty() || *end != '\0' || !std::isfinite(v) || !above_low || v > high) {
          if (low_open && std::isinf(high)) {
            return detail::cat("expects a number above ", low, ", got '", text, "'");
          }
          if (std::isinf(high)) return detail::cat("expects a number from ", low, ", got '", text, "'");
          return detail::cat("expects a number from ", low, " to ", high, ", got '", text, "'");
        }
        return "";
      },
      "");
}

namespace {

// The known flag nearest to a mistyped one (edit distance), or "".
std::string nearest_flag(const CLI::App& app, const std::string& typed) {
  auto distance = [](const std::string& a, const std::string& b) {
    std::vector<size_t> row(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
      size_t diagonal = row[0];
      row[0] = i;
      for (size_t j = 1; j <= b.size(); ++j) {
        const size_t above = row[j];
        row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1])});
        diagonal = above;
      }
    }
    return row[b.size()];
  };
  std::string best;
  size_t best_distance = 4;  // further than 3 edits is no suggestion
  for (const CLI::Option* option : app.get_options()) {
    for (const std::string& long_name : option->get_lnames()) {
      const size_t d = distance(typed, "--" + long_name);
      if (d < best_distance) {
        best_distance = d;
        best = "--" + long_name;
      }
    }
  }
  return best;
}

}  // namespace

void parse_or_exit(CLI::App& app, int argc, char** argv, const std::string& prefix) {
  app.allow_extras();  // reported below, with a suggestion
  app.get_formatter()->column_width(34);
  auto fail = [&prefix](const std::string& problem) {
    std::fprintf(stderr, "%s: %s\n(--help lists every flag)\n", prefix.c_str(), problem.c_str());
    std::exit(2);
  };
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::printf("%s\n", app.help().c_str());
    std::exit(0);
  } catch (const CLI::ParseError& e) {
    fail(e.what());
  }
  if (const std::vector<std::string> extra = app.remaining(); !extra.empty()) {
    const std::string& first = extra.front();
    if (first.rfind("-", 0) != 0) fail("unexpected argument '" + first + "'");
    const std::string near = nearest_flag(app, first.substr(0, first.find('=')));
    fail("unknown flag '" + first + "'" + (near.empty() ? "" : "; did you mean " + near + "?"));
  }
}

}  // namespace tp::train::cli
