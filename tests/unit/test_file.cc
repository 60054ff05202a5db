// tp::write_file: an output file is replaced whole or not at all
// (Note [Replace whole or not at all] in util/file.cc).
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tensorplay/error.h"
#include "tensorplay/util/file.h"
#include "tensorplay/util/temp_dir.h"

namespace {

std::string read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The names in `folder`, hidden ones (a temporary ".NAME.XXXXXX") included.
std::vector<std::string> names_in(const std::string& folder) {
  std::vector<std::string> out;
  for (const auto& entry : std::filesystem::directory_iterator(folder)) {
    out.push_back(entry.path().filename().string());
  }
  return out;
}

// While it lives, a write past `bytes` fails with EFBIG ("File too large")
// instead of raising SIGXFSZ: a full disk, for one process, without root.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    getrlimit(RLIMIT_FSIZE, &saved_);
    rlimit limit = saved_;
    limit.rlim_cur = bytes;
    setrlimit(RLIMIT_FSIZE, &limit);
    old_handler_ = signal(SIGXFSZ, SIG_IGN);
  }
  ~FileSizeLimit() {
    setrlimit(RLIMIT_FSIZE, &saved_);
    signal(SIGXFSZ, old_handler_);
  }

 private:
  rlimit saved_{};
  sighandler_t old_handler_ = SIG_DFL;
};

}  // namespace

TEST_CASE("a write that fails halfway leaves the previous file whole and no temporary behind") {
  tp::TempDir dir("tp-file-test");
  const std::string path = dir.path() + "/demo.json";
  tp::write_file(path, "{\"previous\": true}\n", "the --json file");
  const std::string big(64 * 1024, 'x');
  {
    FileSizeLimit limit(4096);  // the new content does not fit: as a full disk
    const std::string named = "cannot write the --json file '" + path + "'";
    CHECK_THROWS_WITH_AS(tp::write_file(path, big, "the --json file"),
                         doctest::Contains(named.c_str()), tp::Error);
  }
  CHECK(read(path) == "{\"previous\": true}\n");
  CHECK(names_in(dir.path()) == std::vector<std::string>{"demo.json"});
}

TEST_CASE("a new file gets all of its content, readable by others, and no temporary is left") {
  tp::TempDir dir("tp-file-test");
  const std::string path = dir.path() + "/trace.json";
  const std::string content(100000, 'y');
  tp::write_file(path, content, "the --trace file");
  CHECK(read(path) == content);
  struct stat st {};
  REQUIRE(stat(path.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0644);
  CHECK(names_in(dir.path()) == std::vector<std::string>{"trace.json"});
  tp::write_file(path, "short", "the --trace file");  // replaces, not overwrites in place
  CHECK(read(path) == "short");
}

TEST_CASE("a symlink stays a link: its target gets the new content") {
  tp::TempDir dir("tp-file-test");
  const std::string target = dir.path() + "/real.json";
  const std::string link = dir.path() + "/link.json";
  tp::write_file(target, "old", "the --json file");
  REQUIRE(symlink(target.c_str(), link.c_str()) == 0);
  tp::write_file(link, "new", "the --json file");
  CHECK(std::filesystem::is_symlink(link));
  CHECK(read(target) == "new");
}

TEST_CASE("a device is written in place, not replaced") {
  tp::write_file("/dev/null", "discarded", "the --json file");
  struct stat st {};
  REQUIRE(stat("/dev/null", &st) == 0);
  CHECK(S_ISCHR(st.st_mode));
}

TEST_CASE("a folder that does not exist is named, with the reason") {
  CHECK_THROWS_WITH_AS(tp::write_file("/nonexistent-tp-dir/x.json", "{}", "the --json file"),
                       doctest::Contains("/nonexistent-tp-dir/x.json"), tp::Error);
}
