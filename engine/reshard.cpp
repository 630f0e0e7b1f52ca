#include "engine/reshard.h"
