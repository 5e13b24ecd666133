#include "moe/train/config.h"
