#include "choose_allreduce.h"

#include <utility>

#include "../common/config.h"

namespace ddl {

bool AllreduceAlgorithmNamed(const std::string& word, AllreduceAlgorithm* out) {
  static const std::pair<const char*, AllreduceAlgorithm> kNames[] = {
      {"auto", AllreduceAlgorithm::kAuto},
      {"flat", AllreduceAlgorithm::kFlat},
      {"hierarchical", AllreduceAlgorithm::kHierarchical},
      {"racks", AllreduceAlgorithm::kRacks},
  };
  return ChoiceNamed(kNames, word, out);
}

bool UplinkCompressionNamed(const std::string& word, UplinkCompression* out) {
  static const std::pair<const char*, UplinkCompression> kNames[] = {
      {"none", UplinkCompression::kNone},
      {"fp16", UplinkCompression::kFp16},
      {"auto", UplinkCompression::kAuto},
  };
  return ChoiceNamed(kNames, word, out);
}

bool UseRacks(AllreduceAlgorithm algorithm, bool even, int racks) {
  return even && racks > 1 &&
         (algorithm == AllreduceAlgorithm::kRacks || algorithm == AllreduceAlgorithm::kAuto);
}

NetworkShape ShapeOfNetwork(AllreduceAlgorithm algorithm, bool racks_used, bool untold,
                            int racks) {
  if (algorithm == AllreduceAlgorithm::kAuto && !racks_used && (untold || racks > 1)) {
    return NetworkShape::kUnknown;
  }
  return NetworkShape::kOneSwitch;
}

bool UseNodeMemory(AllreduceAlgorithm algorithm, int local_size, bool homogeneous) {
  switch (algorithm) {
    case AllreduceAlgorithm::kHierarchical:
      return true;
    case AllreduceAlgorithm::kAuto:
      // One node with several ranks: shared memory. Several nodes with
      // several ranks each: hierarchical. One rank per node or uneven
      // nodes: flat.
      return local_size > 1 && homogeneous;
    case AllreduceAlgorithm::kRacks:
      return local_size > 1;
    case AllreduceAlgorithm::kFlat:
      return false;
  }
  return false;
}

NetworkChoice ChooseAllreduce(int ranks, size_t bytes, NetworkChoice choice, NetworkShape shape) {
  if (choice == NetworkChoice::kDirectExchange || choice == NetworkChoice::kPairwiseRing ||
      choice == NetworkChoice::kChain) {
    return choice;
  }
  // kAuto, or a choice that belongs to another step: the size rule.
  if (static_cast<size_t>(ranks - 1) * bytes <= kDirectExchangeBytes) {
    return NetworkChoice::kDirectExchange;
  }
  if (shape == NetworkShape::kUnknown && ranks >= 3 && bytes >= kChainMinBytes) {
    return NetworkChoice::kChain;
  }
  return NetworkChoice::kPairwiseRing;
}

bool ChooseSinglePass(bool across, size_t bytes, size_t slot_bytes, NetworkChoice choice) {
  if (bytes == 0 || bytes > slot_bytes) return false;
  if (!across) return bytes <= kSinglePassOnNodeBytes;
  if (choice == NetworkChoice::kNodeLeader) return true;
  return choice == NetworkChoice::kAuto && bytes <= kSinglePassAcrossBytes;
}

}  // namespace ddl
