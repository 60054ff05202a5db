// The shared value checks and parse_or_exit (see command_line.h).
#include "command_line.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>

#include "tensorplay/error.h"

namespace tp::train::cli {

void use_kit_defaults(CLI::App& app) {
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.allow_extras();  // named by parse_or_exit, with a suggestion
  app.get_formatter()->column_width(34);
}

namespace {

// The number `text` spells in full, or nothing (strtod's forms: "10",
// "1e1", "0x3", " 2.5"; not "", "3x", "nan" or "inf").
std::optional<double> finite_number(const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !std::isfinite(v)) return std::nullopt;
  return v;
}

// `what` for one count: "" and `text` rewritten as a plain integer, or why not.
std::string check_whole(std::string& text, int64_t low, int64_t high) {
  const std::optional<double> v = finite_number(text);
  if (!v || *v != std::floor(*v) || *v < static_cast<double>(low) ||
      *v > static_cast<double>(high)) {
    return detail::cat("expects a whole number from ", low, " to ", high, ", got '", text, "'");
  }
  text = std::to_string(static_cast<int64_t>(*v));
  return "";
}

}  // namespace

CLI::Validator whole_number(int64_t low, int64_t high) {
  return CLI::Validator([low, high](std::string& text) { return check_whole(text, low, high); },
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

CLI::Validator whole_numbers(int64_t low, int64_t high) {
  return CLI::Validator(
      [low, high](std::string& list) -> std::string {
        std::string plain;
        for (std::string count : split_commas(list)) {
          if (const std::string problem = check_whole(count, low, high); !problem.empty()) {
            return problem + " in '" + list + "'";
          }
          plain += (plain.empty() ? "" : ",") + count;
        }
        list = plain;
        return "";
      },
      "");
}

CLI::Validator number_in(double low, double high, bool low_open) {
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        const std::optional<double> v = finite_number(text);
        if (!v || (low_open ? *v <= low : *v < low) || *v > high) {
          const std::string from = detail::cat(low_open ? "above " : "from ", low);
          const std::string to = std::isinf(high) ? "" : detail::cat(" to ", high);
          return "expects a number " + from + to + ", got '" + text + "'";
        }
        char plain[40];
        std::snprintf(plain, sizeof plain, "%.17g", *v);  // exact: 17 digits round-trip
        text = plain;
        return "";
      },
      "");
}

CLI::Validator file_name() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        if (text.empty()) return "expects a file name, got ''";
        if (text[0] == '-') {
          return "expects a file name, got '" + text + "', a flag: was the file name left out?";
        }
        return "";
      },
      "");
}

std::string default_text(double value) { return detail::cat("(default ", value, ")"); }

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
  // At most a third of the name's letters changed (and never more than 3):
  // "--stpes" is --steps, but "-x" is no flag in particular.
  size_t best_distance = std::min<size_t>(3, typed.size() / 3) + 1;
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

// CLI11's words for a flag given without its value ("--world-size: 1
// required W missing") in the kit's: "--world-size needs a value: a whole
// number from 1 to 64". What the value must be is the flag's own check's
// answer to an empty value ("expects ..., got ''"), so it is never restated
// here. Any other mismatch keeps CLI11's words.
std::string missing_value_text(CLI::App& app, const std::string& what) {
  const size_t colon = what.find(": ");
  if (colon == std::string::npos || what.find(" required ") == std::string::npos ||
      !what.ends_with(" missing")) {
    return what;
  }
  const std::string name = what.substr(0, colon);
  std::string expects;
  if (CLI::Option* option = app.get_option_no_throw(name)) {
    try {
      std::string empty;
      expects = (*option->get_validator())(empty);
    } catch (const CLI::OptionNotFound&) {  // a flag without a check of its own
    }
  }
  const std::string prefix = "expects ", suffix = ", got ''";
  if (expects.starts_with(prefix) && expects.ends_with(suffix)) {
    return name + " needs a value: " +
           expects.substr(prefix.size(), expects.size() - prefix.size() - suffix.size());
  }
  return name + " needs a value";
}

}  // namespace

void usage_error(const std::string& prefix, const std::string& problem) {
  std::fprintf(stderr, "%s: %s\n(--help lists every flag)\n", prefix.c_str(), problem.c_str());
  std::exit(2);
}

void parse_or_exit(CLI::App& app, int argc, char** argv, const std::string& prefix) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::string usage = app.help();
    while (!usage.empty() && usage.back() == '\n') usage.pop_back();
    std::printf("%s\n", usage.c_str());
    std::exit(0);
  } catch (const CLI::ArgumentMismatch& e) {
    usage_error(prefix, missing_value_text(app, e.what()));
  } catch (const CLI::ParseError& e) {
    usage_error(prefix, e.what());
  }
  if (const std::vector<std::string> extra = app.remaining(); !extra.empty()) {
    const std::string& first = extra.front();
    if (first.size() < 2 || first[0] != '-' || first == "--") {
      usage_error(prefix, "unexpected argument '" + first + "'");
    }
    const std::string near = nearest_flag(app, first.substr(0, first.find('=')));
    usage_error(prefix, "unknown flag '" + first + "'" +
                            (near.empty() ? "" : "; did you mean " + near + "?"));
  }
}

}  // namespace tp::train::cli
