/*
 * An intrusive, circular, doubly linked queue in libuv's manner (its src/queue.h): a struct that
 * can sit in a queue embeds a `queue` node, a queue is a `queue` head whose links point at itself
 * when it is empty, and queue_data() turns a node back into the struct that holds it. Nothing is
 * allocated; inserting and removing are O(1) and cannot fail; a node sits in at most one queue
 * through one member.
 *
 * Not thread-safe: the owner of a queue serialises its use. Removing the node being visited is
 * safe in a loop that took the next node first (queue_foreach_safe()).
 *
 * Internal to the project: not installed. Header-only; compiles as C99 and C++.
 */
#ifndef DDP_QUEUE_H
#define DDP_QUEUE_H

#include <stddef.h>

typedef struct queue {
    struct queue *next;
    struct queue *prev;
} queue;

/* The struct of type `type` whose member `field` is the node `ptr`. */
#define queue_data(ptr, type, field) ((type *)((char *)(ptr) - offsetof(type, field)))

/* Visits every node of the queue headed by `h`, first to last; `q` must not be removed. */
#define queue_foreach(q, h) for ((q) = (h)->next; (q) != (h); (q) = (q)->next)

/* The same, with `n` holding the next node so that the body may remove `q`. */
#define queue_foreach_safe(q, n, h)                                                                \
    for ((q) = (h)->next, (n) = (q)->next; (q) != (h); (q) = (n), (n) = (q)->next)

/* Makes `q` an empty queue (or an unlinked node, for which queue_remove() is then harmless). */
static inline void queue_init(queue *q)
{
    q->next = q;
    q->prev = q;
}

static inline int queue_empty(const queue *h)
{
    return h == h->next;
}

/* The first node of a non-empty queue. */
static inline queue *queue_head(const queue *h)
{
    return h->next;
}

/* Appends `q` to the queue headed by `h`. */
static inline void queue_insert_tail(queue *h, queue *q)
{
    q->next = h;
    q->prev = h->prev;
    q->prev->next = q;
    h->prev = q;
}

/* Prepends `q` to the queue headed by `h`. */
static inline void queue_insert_head(queue *h, queue *q)
{
    q->next = h->next;
    q->prev = h;
    q->next->prev = q;
    h->next = q;
}

/* Unlinks `q` from its queue and leaves it as an unlinked node (queue_init()). */
static inline void queue_remove(queue *q)
{
    q->prev->next = q->next;
    q->next->prev = q->prev;
    queue_init(q);
}

#endif /* DDP_QUEUE_H */
