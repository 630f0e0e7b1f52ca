#include <gtest/gtest.h>

#include "engine/reshard.h"
#include "tests/engine/multiprocess.h"
