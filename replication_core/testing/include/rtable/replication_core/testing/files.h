// Moved to rtable/common/testing/files.h. Kept only for table_replica_test.cpp and
// part_journal_test.cpp, which are being rewritten on another branch: delete this header once
// they include the common one.
#pragma once

#include "rtable/common/testing/files.h"

namespace rtable::core::testing {

using common::testing::readFile;
using common::testing::writeFile;

}  // namespace rtable::core::testing
