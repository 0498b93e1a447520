/* scripts/_guard_pages.c: an inaccessible page after every mapping, for scripts/sanitize.
 *
 * AddressSanitizer sees the heap, the stack and globals, not mmap'd memory, and a new
 * mapping usually lies right below the previous one: a C step that reads past the end
 * of a table's mapping reads its neighbour's bytes and nothing notices. Preloaded after
 * the ASan runtime, this library gives each mapping made without a fixed address a
 * PROT_NONE page right after its end, so such a read faults and ASan reports it.
 *
 * mmap(NULL, len, ...) reserves len rounded up to pages plus one page, inaccessible,
 * then maps the caller's request over the start with MAP_FIXED. The guard page is
 * never unmapped (a page of address space per mapping, for a test run).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <unistd.h>

typedef void *(*mmap_fn)(void *, size_t, int, int, int, off_t);

void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t offset)
{
    static mmap_fn next;
    if (next == NULL)
        next = (mmap_fn)dlsym(RTLD_NEXT, "mmap");
    if (addr != NULL || (flags & MAP_FIXED) || len == 0)
        return next(addr, len, prot, flags, fd, offset);
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t span = (len + page - 1) / page * page;
    if (span < len || span + page < span) /* wraps: leave it to the kernel to refuse */
        return next(addr, len, prot, flags, fd, offset);
    char *area = next(NULL, span + page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                      -1, 0);
    if (area == MAP_FAILED)
        return area;
    void *mapped = next(area, len, prot, flags | MAP_FIXED, fd, offset);
    if (mapped == MAP_FAILED)
        munmap(area, span + page);
    return mapped;
}

void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t offset)
    __attribute__((alias("mmap")));
