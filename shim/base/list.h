/* list.h - intrusive doubly-linked lists.
 *
 * A list is a struct cd_link whose next is its first element and whose prev
 * its last; an element embeds a struct cd_link and is found from it with
 * CD_CONTAINER. Unlinking is O(1) from the element alone. No locking: the
 * owner of a list guards it.
 */
#ifndef CUDEFER_LIST_H
#define CUDEFER_LIST_H

#include <stdbool.h>
#include <stddef.h>

struct cd_link {
    struct cd_link *prev, *next;
};

#define CD_CONTAINER(ptr, type, member) ((type *)((char *)(ptr) - offsetof(type, member)))

static inline void cd_list_init(struct cd_link *list)
{
    list->prev = list->next = list;
}

static inline bool cd_list_empty(const struct cd_link *list)
{
    return list->next == list;
}

/* Whether e is on a list (its links are cleared when it leaves one). */
static inline bool cd_linked(const struct cd_link *e)
{
    return e->next != NULL;
}

static inline void cd_list_append(struct cd_link *list, struct cd_link *e)
{
    e->prev = list->prev;
    e->next = list;
    list->prev->next = e;
    list->prev = e;
}

static inline void cd_list_remove(struct cd_link *e)
{
    e->prev->next = e->next;
    e->next->prev = e->prev;
    e->prev = e->next = NULL;
}

/* Moves every element of from to the end of to, in order. */
static inline void cd_list_splice(struct cd_link *to, struct cd_link *from)
{
    if (cd_list_empty(from))
        return;
    from->next->prev = to->prev;
    to->prev->next = from->next;
    from->prev->next = to;
    to->prev = from->prev;
    cd_list_init(from);
}

#endif
