#include "topology.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <sstream>

namespace ddl {

namespace {

std::vector<std::string> Split(const std::string& text, char sep) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream in(text);
  while (std::getline(in, part, sep)) parts.push_back(part);
  if (!text.empty() && text.back() == sep) parts.push_back("");
  return parts;
}

std::string Trim(const std::string& s) {
  const char* space = " \t\n\r";
  const size_t a = s.find_first_not_of(space);
  if (a == std::string::npos) return "";
  return s.substr(a, s.find_last_not_of(space) - a + 1);
}

// "node3" matches "node3" and "node3.cluster.local", either way round.
bool SameHost(const std::string& a, const std::string& b) {
  if (a == b) return true;
  const std::string short_a = a.substr(0, a.find('.'));
  const std::string short_b = b.substr(0, b.find('.'));
  return short_a == short_b && (short_a == a || short_b == b);
}

RackPlace FromDdlTopology(const std::string& text, const std::string& host) {
  RackPlace p{host, "", "DDL_TOPOLOGY", text, ""};
  if (Trim(text) == "none") return p;
  if (Trim(text) == "probe") return RackPlace{host, "", "probe", text, ""};
  if (Trim(text) == "unknown") return RackPlace{host, "", "unknown", text, ""};
  const std::string form = " (expected RACK=HOST,HOST;RACK=HOST,..., none, probe or unknown)";
  std::map<std::string, std::string> rack_of_host;
  for (const std::string& entry : Split(text, ';')) {
    if (Trim(entry).empty()) continue;  // a trailing ';'
    const size_t eq = entry.find('=');
    const std::string rack = Trim(entry.substr(0, eq));
    if (eq == std::string::npos || rack.empty()) {
      p.error = "DDL_TOPOLOGY='" + text + "': '" + Trim(entry) + "' names no rack" + form;
      return p;
    }
    const std::vector<std::string> hosts = Split(entry.substr(eq + 1), ',');
    for (const std::string& raw : hosts) {
      const std::string h = Trim(raw);
      if (h.empty()) {
        p.error = "DDL_TOPOLOGY='" + text + "': rack '" + rack + "' has an empty host name" + form;
        return p;
      }
      auto [it, added] = rack_of_host.emplace(h, rack);
      if (!added) {
        p.error = "DDL_TOPOLOGY='" + text + "': host '" + h + "' is in rack '" + it->second +
                  "' and in rack '" + rack + "'";
        return p;
      }
    }
  }
  if (rack_of_host.empty()) {
    p.error = "DDL_TOPOLOGY='" + text + "' names no racks" + form;
    return p;
  }
  for (const auto& [h, rack] : rack_of_host) {
    if (SameHost(h, host)) {
      p.rack = rack;
      return p;
    }
  }
  p.error = "DDL_TOPOLOGY does not name this host '" + host + "'";
  return p;
}

RackPlace FromSlurm(const std::string& addr, const char* pattern_env, const std::string& host) {
  RackPlace p{host, "", "SLURM_TOPOLOGY_ADDR", addr, ""};
  const std::vector<std::string> parts = Split(addr, '.');
  // Without a pattern, Slurm's convention: the last name is the node's.
  std::vector<std::string> kinds(parts.size(), "switch");
  if (!kinds.empty()) kinds.back() = "node";
  if (pattern_env != nullptr && *pattern_env != '\0') {
    kinds = Split(pattern_env, '.');
    p.setting += " (pattern " + std::string(pattern_env) + ")";
    if (kinds.size() != parts.size()) {
      p.error = "SLURM_TOPOLOGY_ADDR='" + addr + "' has " + std::to_string(parts.size()) +
                " names but SLURM_TOPOLOGY_ADDR_PATTERN='" + pattern_env + "' has " +
                std::to_string(kinds.size());
      return p;
    }
  }
  // The rack is the path of switches above the node: its leaf switch.
  for (size_t i = 0; i < parts.size(); ++i) {
    if (kinds[i] == "node") break;
    if (kinds[i] != "switch" || parts[i].empty()) {
      p.error = "SLURM_TOPOLOGY_ADDR='" + addr + "': cannot read '" + parts[i] + "' as a " +
                kinds[i];
      return p;
    }
    p.rack += (p.rack.empty() ? "" : ".") + parts[i];
  }
  return p;
}

// Length-prefixed fields, so names may hold any character.
void Put(std::string& out, const std::string& field) {
  const uint32_t n = static_cast<uint32_t>(field.size());
  out.append(reinterpret_cast<const char*>(&n), sizeof n);
  out += field;
}
bool Take(const std::vector<char>& in, size_t& at, std::string* field) {
  uint32_t n = 0;
  if (at + sizeof n > in.size()) return false;
  std::memcpy(&n, in.data() + at, sizeof n);
  at += sizeof n;
  if (at + n > in.size()) return false;
  field->assign(in.data() + at, n);
  at += n;
  return true;
}

struct Offer {
  RackPlace place;
  int64_t node = 0;
};

// What a rank saw, in words (for error messages).
std::string Saw(const RackPlace& p) {
  if (p.source.empty()) return "no topology (neither DDL_TOPOLOGY nor SLURM_TOPOLOGY_ADDR set)";
  if (p.source == "probe") return "DDL_TOPOLOGY=" + p.setting + " (racks to be measured)";
  if (p.source == "unknown") return "DDL_TOPOLOGY=" + p.setting + " (no racks, no probe)";
  std::string where = p.rack.empty() ? "one switch" : "rack '" + p.rack + "'";
  return where + " from " + p.source + "=" + p.setting;
}

// Ranks grouped by a text, in order of each text's lowest rank:
// "ranks 0-3 <text0>; rank 4 <text1>".
std::string Grouped(const std::vector<std::string>& texts, const std::vector<int>& ranks) {
  std::vector<std::string> order;
  std::map<std::string, std::vector<int>> by_text;
  for (int r : ranks) {
    if (by_text.count(texts[r]) == 0) order.push_back(texts[r]);
    by_text[texts[r]].push_back(r);
  }
  std::string out;
  for (const std::string& t : order) {
    const std::vector<int>& rs = by_text[t];
    out += (out.empty() ? "" : "; ") + std::string(rs.size() > 1 ? "ranks " : "rank ") +
           RankRuns(rs) + " " + t;
  }
  return out;
}

Status Decide(const std::vector<Offer>& offers, Topology* out) {
  const int n = static_cast<int>(offers.size());
  std::vector<int> all(n);
  for (int r = 0; r < n; ++r) all[r] = r;
  std::vector<std::string> text(n);
  // Errors reading the environment, on whichever ranks.
  std::vector<int> failed;
  for (int r = 0; r < n; ++r) {
    if (!offers[r].place.error.empty()) {
      failed.push_back(r);
      text[r] = "(host " + offers[r].place.host + "): " + offers[r].place.error;
    }
  }
  if (!failed.empty()) {
    return Status::InvalidArgument("the topology could not be read: " + Grouped(text, failed));
  }
  // Every rank must have read the same source; DDL_TOPOLOGY must be the
  // same text everywhere (Slurm's address differs per node by design), and
  // either every rank or none knows a rack.
  for (int r = 0; r < n; ++r) {
    const RackPlace& p = offers[r].place;
    if (p.source == "SLURM_TOPOLOGY_ADDR") {
      text[r] = std::string(p.rack.empty() ? "no rack" : "a rack") + " from SLURM_TOPOLOGY_ADDR";
    } else {
      text[r] = p.source + "=" + p.setting;
    }
  }
  const bool agree = std::all_of(text.begin(), text.end(),
                                 [&](const std::string& t) { return t == text[0]; });
  if (!agree) {
    for (int r = 0; r < n; ++r) {
      text[r] = "(host " + offers[r].place.host + ") saw " + Saw(offers[r].place);
    }
    return Status::InvalidArgument("ranks disagree about the topology: " + Grouped(text, all));
  }
  // Nodes and racks, numbered by lowest rank.
  Topology t;
  t.source = offers[0].place.source;
  std::map<int64_t, int> node_index;
  std::map<std::string, int> rack_index;
  std::vector<std::vector<int>> ranks_of_node;
  for (int r = 0; r < n; ++r) {
    const Offer& o = offers[r];
    auto [node, new_node] = node_index.emplace(o.node, static_cast<int>(node_index.size()));
    auto [rack, new_rack] = rack_index.emplace(o.place.rack, static_cast<int>(rack_index.size()));
    if (new_rack) t.racks.push_back(o.place.rack);
    if (new_node) {
      t.rack_of_node.push_back(rack->second);
      t.host_of_node.push_back(o.place.host);
      ranks_of_node.emplace_back();
    }
    ranks_of_node[node->second].push_back(r);
    t.node_of_rank.push_back(node->second);
    t.rack_of_rank.push_back(rack->second);
  }
  // The ranks of one node share its switch.
  for (const std::vector<int>& ranks : ranks_of_node) {
    bool same = true;
    for (int r : ranks) same &= t.rack_of_rank[r] == t.rack_of_rank[ranks[0]];
    if (!same) {
      for (int r : ranks) {
        text[r] = "(host " + offers[r].place.host + ") saw " + Saw(offers[r].place);
      }
      return Status::InvalidArgument(
          "ranks of one node disagree about its rack: " + Grouped(text, ranks));
    }
  }
  std::vector<int> nodes_in(t.racks.size(), 0);
  for (int rack : t.rack_of_node) ++nodes_in[rack];
  const bool even = std::all_of(nodes_in.begin(), nodes_in.end(),
                                [&](int k) { return k == nodes_in[0]; });
  t.nodes_per_rack = even ? nodes_in[0] : 0;
  *out = std::move(t);
  return Status::Ok();
}

}  // namespace

RackPlace DetectRack(const std::function<const char*(const char*)>& getenv,
                     const std::string& host) {
  const char* ddl = getenv("DDL_TOPOLOGY");
  if (ddl != nullptr && *ddl != '\0') return FromDdlTopology(ddl, host);
  const char* slurm = getenv("SLURM_TOPOLOGY_ADDR");
  if (slurm != nullptr && *slurm != '\0') {
    return FromSlurm(slurm, getenv("SLURM_TOPOLOGY_ADDR_PATTERN"), host);
  }
  return RackPlace{host, "", "", "", ""};
}

std::string Topology::Describe() const {
  const int nodes = static_cast<int>(rack_of_node.size());
  if (racks.size() <= 1) {
    const std::string count = std::to_string(nodes) + " node(s)";
    if (uncertain) return "the probe could not tell: " + count;
    if (source.empty()) return "no topology given: " + count;
    if (source == "unknown") return "no topology given (DDL_TOPOLOGY=unknown): " + count;
    return "one switch: " + count + " (" + source + ")";
  }
  std::string out = std::to_string(racks.size()) + " racks";
  out += nodes_per_rack > 0 ? " x " + std::to_string(nodes_per_rack) + " nodes"
                            : " of uneven sizes";
  out += " (" + source + "):";
  for (size_t k = 0; k < racks.size(); ++k) {
    std::vector<int> ranks;
    for (size_t r = 0; r < rack_of_rank.size(); ++r) {
      if (rack_of_rank[r] == static_cast<int>(k)) ranks.push_back(static_cast<int>(r));
    }
    out += std::string(k ? ";" : "") + " " + racks[k] + " = ranks " + RankRuns(ranks);
  }
  return out;
}

Status AgreeOnTopology(ControlPlane& world, const RackPlace& mine, int64_t node_id,
                       Topology* out) {
  std::string record;
  for (const std::string* f : {&mine.host, &mine.rack, &mine.source, &mine.setting, &mine.error}) {
    Put(record, *f);
  }
  Put(record, std::to_string(node_id));
  // Rank 0 collects every offer and passes them all on; each rank then
  // reaches the same verdict from the same bytes.
  std::vector<std::vector<char>> gathered =
      world.GatherBytes(std::vector<char>(record.begin(), record.end()), 0);
  std::vector<char> all;
  if (world.rank() == 0) {
    for (const std::vector<char>& one : gathered) {
      const std::string len = std::to_string(one.size()) + ":";
      all.insert(all.end(), len.begin(), len.end());
      all.insert(all.end(), one.begin(), one.end());
    }
  }
  world.BroadcastBytes(all, 0);
  std::vector<Offer> offers;
  size_t at = 0;
  while (at < all.size()) {
    const size_t colon = std::find(all.begin() + at, all.end(), ':') - all.begin();
    const size_t len = std::stoul(std::string(all.begin() + at, all.begin() + colon));
    std::vector<char> one(all.begin() + colon + 1, all.begin() + colon + 1 + len);
    at = colon + 1 + len;
    Offer o;
    size_t k = 0;
    std::string node;
    bool ok = true;
    for (std::string* f : {&o.place.host, &o.place.rack, &o.place.source, &o.place.setting,
                           &o.place.error, &node}) {
      ok &= Take(one, k, f);
    }
    if (!ok) return Status::Internal("a topology offer arrived truncated");
    o.node = std::stoll(node);
    offers.push_back(std::move(o));
  }
  if (static_cast<int>(offers.size()) != world.size()) {
    return Status::Internal("topology: " + std::to_string(offers.size()) + " offers from " +
                            std::to_string(world.size()) + " ranks");
  }
  return Decide(offers, out);
}

}  // namespace ddl
