package sqlite

import (
	"context"
	"database/sql"
	"sync"
)

// maxCachedStmts bounds a pool's statement cache. The store's SQL texts are
// a small fixed set plus a few filter combinations (list queries), far
// below this; a text beyond it simply runs unprepared.
const maxCachedStmts = 512

// stmtCache holds one prepared *sql.Stmt per SQL text for a pool.
// database/sql prepares a Stmt once per connection and reuses it, and the
// driver keeps the compiled sqlite3_stmt of a single-statement text, so a
// cached text is parsed once per connection instead of on every call
// (parsing was about a fifth of the task queue's CPU).
//
// A statement is only ever prepared through the pool outside a transaction:
// the writer pool has one connection, which a running transaction holds, so
// preparing from inside one would wait on itself. A text first seen inside a
// transaction is therefore remembered (miss) and prepared after the
// transaction ends (prepareMissed); from then on the transaction binds the
// cached statement to its connection (Tx.StmtContext), which reuses the
// connection's prepared copy.
type stmtCache struct {
	db *sql.DB
	mu sync.Mutex
	m  map[string]*sql.Stmt
	// missed are texts run inside a transaction before they were cached.
	missed map[string]bool
}

func newStmtCache(db *sql.DB) *stmtCache {
	return &stmtCache{db: db, m: map[string]*sql.Stmt{}, missed: map[string]bool{}}
}

// lookup is the cached statement of query, or nil.
func (c *stmtCache) lookup(query string) *sql.Stmt {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[query]
}

// get is the cached statement of query, prepared through the pool if it is
// not cached yet; nil if the cache is full or preparing failed (the caller
// then runs the text unprepared, which reports the error if there is one).
// It must not be called while this goroutine holds a transaction of the
// pool.
func (c *stmtCache) get(ctx context.Context, query string) *sql.Stmt {
	c.mu.Lock()
	s, full := c.m[query], len(c.m) >= maxCachedStmts
	c.mu.Unlock()
	if s != nil || full {
		return s
	}
	s, err := c.db.PrepareContext(ctx, query)
	if err != nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if old := c.m[query]; old != nil {
		_ = s.Close()
		return old
	}
	if len(c.m) >= maxCachedStmts {
		_ = s.Close()
		return nil
	}
	c.m[query] = s
	delete(c.missed, query)
	return s
}

// miss remembers a text that ran inside a transaction uncached.
func (c *stmtCache) miss(query string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.missed) < maxCachedStmts {
		c.missed[query] = true
	}
}

// prepareMissed prepares the texts remembered by miss. Called with no
// transaction of the pool held by this goroutine.
func (c *stmtCache) prepareMissed(ctx context.Context) {
	c.mu.Lock()
	if len(c.missed) == 0 {
		c.mu.Unlock()
		return
	}
	qs := make([]string, 0, len(c.missed))
	for q := range c.missed {
		qs = append(qs, q)
	}
	clear(c.missed)
	c.mu.Unlock()
	for _, q := range qs {
		c.get(context.WithoutCancel(ctx), q)
	}
}

// close closes every cached statement.
func (c *stmtCache) close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var first error
	for q, s := range c.m {
		if err := s.Close(); err != nil && first == nil {
			first = err
		}
		delete(c.m, q)
	}
	return first
}
