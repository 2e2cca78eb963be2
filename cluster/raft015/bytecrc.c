/* bytecrc: libraft 0.15's byteCrc32 through ISA-L (bytecrc.h). */
#include "bytecrc.h"

#include <isa-l/crc.h>

uint32_t __wrap_byteCrc32(const void *buf, size_t size, uint32_t init)
{
    return ~crc32_ieee(~init, buf, size);
}
