/* The module ABI as the core sees it: the current version (shardload/module.h) and the frozen
 * v1 tables (shardload/module_v1.h), which the registry adapts so that a module built against
 * ABI v1 keeps loading (registry.c; docs/DESIGN.md#modules). Both are installed. */
#ifndef SHARDLOAD_CORE_MODULE_H
#define SHARDLOAD_CORE_MODULE_H

#include "shardload/module.h"
#include "shardload/module_v1.h"

#endif
