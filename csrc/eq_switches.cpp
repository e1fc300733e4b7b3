// FLASH_EQLINEAR_DEBUG parsed when it changes (per thread: no lock on the call path).
#include "eq_switches.h"

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace flash_eqlinear {
namespace {

bool known(const std::string& name) {
  for (const char* k : kDebugSwitches)
    if (name == k) return true;
  return false;
}

std::vector<std::pair<std::string, std::string>> parse(const std::string& raw) {
  std::vector<std::pair<std::string, std::string>> kv;
  size_t start = 0;
  while (start <= raw.size()) {
    size_t end = raw.find(',', start);
    if (end == std::string::npos) end = raw.size();
    const std::string item = raw.substr(start, end - start);
    start = end + 1;
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    const std::string name = item.substr(0, eq);
    if (eq == std::string::npos || !known(name)) {
      std::string names;
      for (const char* k : kDebugSwitches) names += std::string(names.empty() ? "" : ", ") + k;
      throw std::invalid_argument("FLASH_EQLINEAR_DEBUG: want name=value items separated by commas, names among " +
                                  names + "; got '" + item + "'");
    }
    kv.emplace_back(name, item.substr(eq + 1));
  }
  return kv;
}

}  // namespace

const char* debug_switch(const char* name) {
  const char* raw = std::getenv("FLASH_EQLINEAR_DEBUG");
  if (raw == nullptr || *raw == '\0') return nullptr;
  thread_local std::string cached;
  thread_local std::vector<std::pair<std::string, std::string>> kv;
  if (cached != raw) {
    kv = parse(raw);
    cached = raw;
  }
  for (const auto& [k, v] : kv)
    if (k == name) return v.c_str();
  return nullptr;
}

bool debug_is(const char* name, const char* value) {
  const char* v = debug_switch(name);
  return v != nullptr && std::strcmp(v, value) == 0;
}

bool sm90_path_enabled() {
  const char* v = std::getenv("FLASH_EQLINEAR_SM90");
  return v == nullptr || std::strcmp(v, "0") != 0;
}

bool fp32_split_tf32() {
  const char* v = std::getenv("FLASH_EQLINEAR_FP32");
  return v != nullptr && std::strcmp(v, "3xtf32") == 0;
}

}  // namespace flash_eqlinear
