#include "moe/data/token_sources.h"

#include <glob.h>

#include <algorithm>
#include <filesystem>

#include "moe/core/error.h"

namespace moe {

namespace fs = std::filesystem;

std::vector<TokenFile> source_files(const std::string& path, const std::string& format, const std::string& key) {
  MOE_CHECK(!path.empty(), key, " is empty: give a token file, a folder or a glob");
  std::vector<TokenFile> files;
  std::error_code ec;
  if (path.find_first_of("*?[") != std::string::npos) {
    glob_t g{};
    const int rc = ::glob(path.c_str(), GLOB_ERR, nullptr, &g);
    for (size_t i = 0; rc == 0 && i < g.gl_pathc; ++i)
      if (fs::is_regular_file(g.gl_pathv[i], ec)) files.push_back({g.gl_pathv[i], std::nullopt});
    globfree(&g);
    MOE_CHECK(rc == 0 || rc == GLOB_NOMATCH, key, " = \"", path, "\": the glob could not be read");
    MOE_CHECK(!files.empty(), key, " = \"", path, "\" matches no token file");
  } else if (fs::is_directory(path, ec)) {
    // A token-file name that is not a readable file (a broken link, a folder) is never skipped quietly.
    for (const auto& e : fs::directory_iterator(path)) {
      const std::string ext = e.path().extension().string();
      MOE_CHECK(!(ext == ".npy" || (format == "raw" && ext == ".bin")) || e.is_regular_file(ec), key, " = \"", path,
                "\": ", e.path().string(), " is not a readable token file (a folder, a broken link or a special "
                "file); move it away");
    }
    if (format == "npy") {
      files = list_token_files(path);
    } else {
      for (const auto& e : fs::directory_iterator(path)) {
        const std::string ext = e.path().extension().string();
        if ((ext == ".npy" || ext == ".bin") && e.is_regular_file(ec)) files.push_back({e.path().string(), std::nullopt});
      }
      MOE_CHECK(!files.empty(), key, " = \"", path, "\": the folder holds no raw token files (*.npy, *.bin)");
    }
  } else {
    MOE_CHECK(fs::exists(path, ec), key, " = \"", path, "\" does not exist");
    MOE_CHECK(fs::is_regular_file(path, ec), key, " = \"", path, "\" is neither a token file nor a folder");
    files.push_back({path, std::nullopt});
  }
  std::sort(files.begin(), files.end(), [](const TokenFile& a, const TokenFile& b) { return a.path < b.path; });
  return files;
}

}  // namespace moe
