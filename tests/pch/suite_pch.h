// The headers every planted bug, untouched exercise and checker of the test
// suite parses first, precompiled once (tests/meson.build: suite_pch):
// the standard library's and the library's headers a stage's sources
// include. Force-included (-include) into those programs only, never into
// your exercise's build, so a missing #include still shows there.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tensorplay/autograd/engine.h"
#include "tensorplay/autograd/grad_mode.h"
#include "tensorplay/autograd/node.h"
#include "tensorplay/distributed/process_group.h"
#include "tensorplay/error.h"
#include "tensorplay/memory.h"
#include "tensorplay/nn/module.h"
#include "tensorplay/tensor.h"
#include "tensorplay/trace.h"
#include "tensorplay/train/capabilities.h"
