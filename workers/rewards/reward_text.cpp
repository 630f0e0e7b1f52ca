#include "workers/rewards/reward_text.h"

namespace baton::rewards::text {

size_t code_point_size(std::string_view s, size_t i) {
  const auto lead = static_cast<unsigned char>(s[i]);
  size_t size = 1;
  if (lead >= 0xF0 && lead < 0xF8)
    size = 4;
  else if (lead >= 0xE0)
    size = lead < 0xF0 ? 3 : 1;
  else if (lead >= 0xC0)
    size = 2;
  if (i + size > s.size()) return 1;
  for (size_t k = 1; k < size; ++k)
    if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return 1;
  return size;
}

size_t code_point_count(std::string_view s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size(); i += code_point_size(s, i)) ++n;
  return n;
}

std::string_view last_code_points(std::string_view s, size_t n) {
  const size_t total = code_point_count(s);
  if (total <= n) return s;
  size_t skip = total - n, i = 0;
  while (skip-- > 0) i += code_point_size(s, i);
  return s.substr(i);
}

std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
  std::string out;
  size_t pos = 0;
  while (true) {
    const size_t hit = s.find(from, pos);
    if (hit == std::string_view::npos) break;
    out.append(s.substr(pos, hit - pos)).append(to);
    pos = hit + from.size();
  }
  out.append(s.substr(pos));
  return out;
}

std::vector<std::string> split(std::string_view s, std::string_view sep) {
  std::vector<std::string> parts;
  size_t pos = 0;
  while (true) {
    const size_t hit = s.find(sep, pos);
    if (hit == std::string_view::npos) break;
    parts.emplace_back(s.substr(pos, hit - pos));
    pos = hit + sep.size();
  }
  parts.emplace_back(s.substr(pos));
  return parts;
}

size_t count(std::string_view s, std::string_view sub) {
  size_t n = 0;
  for (size_t pos = s.find(sub); pos != std::string_view::npos; pos = s.find(sub, pos + sub.size()))
    ++n;
  return n;
}

std::string_view strip(std::string_view s) {
  const char* kSpace = " \t\n\r\v\f";
  const size_t begin = s.find_first_not_of(kSpace);
  if (begin == std::string_view::npos) return {};
  return s.substr(begin, s.find_last_not_of(kSpace) - begin + 1);
}

}  // namespace baton::rewards::text
