// The statements of the waiting queue (_wait.ts describes the protocol).
import { tableName } from "./_ddl.ts";
import { guarded, upsert } from "./_sql.ts";

// Queue locks live in the two-int4 key space (objsubid 2 [pglocks]):
// (queue, 0) is the marker every waiter holds in share mode, (queue,
// ticket) a waiter's node. They never collide with names' bigint keys,
// nor (`queue` is never 1920298604) with the DDL lock.

/** The statements of the waiting queue, for the table `schema.runlock_locks`. */
export interface QueueStatements {
  tryUnqueued: string;
  enqueue: string;
  wait: string;
  afterWait: string;
  unlockNode: string;
}

// Granted advisory locks of queue `param` in this database, in pg_locks.
const queueNodes = (param: string) =>
  `FROM pg_catalog.pg_locks l
      WHERE l.locktype OPERATOR(pg_catalog.=) 'advisory' AND l.granted
        AND l.objsubid OPERATOR(pg_catalog.=) 2
        AND l.database OPERATOR(pg_catalog.=) (
          SELECT d.oid FROM pg_catalog.pg_database d
          WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
        AND l.classid OPERATOR(pg_catalog.=) ${param}::integer::pg_catalog.oid`;

/** Builds the queue's statements for the table `schema.runlock_locks`. */
export function queueStatements(schema: string): QueueStatements {
  const table = tableName(schema);
  return {
    // The try of an acquire that may wait: as tryAcquire, but only when
    // nobody is queued (this exclusive try of the marker, held to the end
    // of the statement, fails while a waiter holds it shared); if it does
    // not get the lock it joins the queue at once, as enqueue does (our own
    // share lock does not conflict with it). So no newcomer takes the lock
    // in the moment it is free between a release and the next head's wait.
    // One row: fence and started if taken, `empty` (nobody was queued),
    // `ticket` and `queued` (false when another took the ticket or held
    // the marker at that instant: the caller enqueues).
    // $1-$6 as tryAcquire, $7 queue, $8 the nonce.
    tryUnqueued: `WITH q AS MATERIALIZED (
        SELECT pg_catalog.pg_try_advisory_xact_lock(${
      guarded("$7::integer", "integer", 8)
    }, 0) AS empty
      ), got AS MATERIALIZED (
        SELECT CASE WHEN q.empty
          THEN pg_catalog.pg_try_advisory_lock(${
      guarded("$2::bigint", "bigint", 8)
    }) ELSE false END AS ok
        FROM q
      ), taken AS (
        ${upsert(table, "got WHERE got.ok")}
      ), mark AS MATERIALIZED (
        SELECT pg_catalog.pg_try_advisory_lock_shared(${
      guarded("$7::integer", "integer", 8)
    }, 0) AS ok
        FROM got WHERE NOT got.ok
      ), t AS MATERIALIZED (
        SELECT COALESCE((SELECT pg_catalog.max(l.objid::bigint) ${
      queueNodes("$7")
    }), 0)
          OPERATOR(pg_catalog.+) 1 AS ticket
        FROM mark WHERE mark.ok
      ), n AS MATERIALIZED (
        SELECT t.ticket::integer AS ticket,
          pg_catalog.pg_try_advisory_lock(${
      guarded("$7::integer", "integer", 8)
    }, t.ticket::integer) AS ok
        FROM t
      ), u AS MATERIALIZED (
        SELECT n.ticket, n.ok,
          CASE WHEN n.ok THEN true
            ELSE pg_catalog.pg_advisory_unlock_shared(${
      guarded("$7::integer", "integer", 8)
    }, 0) END
          AS unmarked
        FROM n
      ) SELECT taken.fence, taken.started, q.empty, u.ticket,
          COALESCE(u.ok, false) AS queued
        FROM q LEFT JOIN taken ON true LEFT JOIN u ON true`,

    // Joining: the marker shared (waiting up to 1 s, only while a
    // tryUnqueued holds it), then the ticket after the greatest held, and
    // its node without waiting (pg_locks is read between the two, in CTE
    // order). `ok` false: another waiter took that ticket; the marker is
    // let go of and the caller tries again. A queue never empty for 2^31
    // arrivals overflows the integer: an error, and the caller waits
    // outside the queue. $1 queue, $2 the nonce.
    enqueue: `WITH cfg AS MATERIALIZED (
        SELECT pg_catalog.set_config('lock_timeout', '1000', true)
      ), mark AS MATERIALIZED (
        SELECT pg_catalog.pg_advisory_lock_shared(${
      guarded("$1::integer", "integer", 2)
    }, 0) FROM cfg
      ), t AS MATERIALIZED (
        SELECT COALESCE((SELECT pg_catalog.max(l.objid::bigint) ${
      queueNodes("$1")
    }), 0)
          OPERATOR(pg_catalog.+) 1 AS ticket
        FROM mark
      ), n AS MATERIALIZED (
        SELECT t.ticket::integer AS ticket,
          pg_catalog.pg_try_advisory_lock(${
      guarded("$1::integer", "integer", 2)
    }, t.ticket::integer) AS ok
        FROM t
      ) SELECT n.ticket, n.ok,
          CASE WHEN n.ok THEN true
            ELSE pg_catalog.pg_advisory_unlock_shared(${
      guarded("$1::integer", "integer", 2)
    }, 0) END
          AS unmarked
        FROM n`,

    // One slice ($7 ms) of waiting in the queue, steps in CTE order:
    // - with a predecessor ($10, else NULL): wait for its node and let go
    //   of it at once (we are its only waiter: a slice running out loses
    //   nothing);
    // - `pred`: the greatest ticket below ours ($9) another session holds;
    // - none: we are the head: wait for the key, then let go of our node
    //   and the marker (our successor waits on the key while we hold it)
    //   and write the record, as waitAcquire does.
    // `pred` reads cfg itself: with $10 NULL the planner drops `waited`,
    // and lock_timeout would never be set. lock_timeout bounds each wait,
    // not the statement, so `pred` sets it to what is left of $7 (at least
    // 1 ms), or a predecessor letting go after X ms would cost X + $7.
    // One row: fence and started if taken, else NULL and the next `pred`.
    // A failure after the key was granted leaves the key held and our node
    // let go of; before, the reverse (see afterWait).
    // $1-$6 as waitAcquire, $7 ms, $8 queue, $9 ticket, $10 predecessor,
    // $11 the nonce.
    wait: `WITH cfg AS MATERIALIZED (
        SELECT pg_catalog.set_config('lock_timeout', $7::pg_catalog.text, true)
      ), waited AS MATERIALIZED (
        SELECT pg_catalog.pg_advisory_lock(${
      guarded("$8::integer", "integer", 11)
    }, $10::integer) FROM cfg
        WHERE $10::integer IS NOT NULL
      ), freed AS MATERIALIZED (
        SELECT pg_catalog.pg_advisory_unlock(${
      guarded("$8::integer", "integer", 11)
    }, $10::integer)
        FROM waited
      ), pred AS MATERIALIZED (
        SELECT (SELECT pg_catalog.max(l.objid::bigint)::integer ${
      queueNodes("$8")
    }
            AND l.objid OPERATOR(pg_catalog.<) $9::integer::pg_catalog.oid
            AND l.objid OPERATOR(pg_catalog.>) 0::pg_catalog.oid
            AND l.pid OPERATOR(pg_catalog.<>) pg_catalog.pg_backend_pid()
          ) AS pred,
          pg_catalog.set_config('lock_timeout', GREATEST(1,
            $7::pg_catalog.text::integer OPERATOR(pg_catalog.-)
            (pg_catalog.date_part('epoch', pg_catalog.clock_timestamp()
              OPERATOR(pg_catalog.-) pg_catalog.statement_timestamp())
              OPERATOR(pg_catalog.*) 1000)::integer)::pg_catalog.text, true)
            AS left_ms
        FROM cfg, (SELECT pg_catalog.count(*) FROM freed) f
      ), got AS MATERIALIZED (
        SELECT pg_catalog.pg_advisory_lock(${
      guarded("$2::bigint", "bigint", 11)
    }) FROM pred
        WHERE pred.pred IS NULL
      ), node AS MATERIALIZED (
        SELECT pg_catalog.pg_advisory_unlock(${
      guarded("$8::integer", "integer", 11)
    }, $9::integer),
          pg_catalog.pg_advisory_unlock_shared(${
      guarded("$8::integer", "integer", 11)
    }, 0)
        FROM got
      ), taken AS (
        ${upsert(table, "node")}
      ) SELECT taken.fence, taken.started, pred.pred
        FROM pred LEFT JOIN taken ON true`,

    // After a failed wait: drops the name's key if the statement was
    // granted it, and says whether we still hold our node (then it failed
    // before the key was granted, and we keep our place).
    // $1 key, $2 classid, $3 objid (its halves), $4 queue, $5 ticket,
    // $6 the session's nonce.
    afterWait: `WITH mine AS MATERIALIZED (
        SELECT l.objsubid, l.classid, l.objid FROM pg_catalog.pg_locks l
        WHERE l.locktype OPERATOR(pg_catalog.=) 'advisory' AND l.granted
          AND l.pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid()
      ) SELECT
        (SELECT pg_catalog.pg_advisory_unlock(${
      guarded("$1::bigint", "bigint", 6)
    }) FROM mine
          WHERE mine.objsubid OPERATOR(pg_catalog.=) 1
            AND mine.classid OPERATOR(pg_catalog.=) $2::pg_catalog.oid
            AND mine.objid OPERATOR(pg_catalog.=) $3::pg_catalog.oid
          LIMIT 1) AS key_dropped,
        EXISTS (SELECT 1 FROM mine
          WHERE mine.objsubid OPERATOR(pg_catalog.=) 2
            AND mine.classid OPERATOR(pg_catalog.=) $4::integer::pg_catalog.oid
            AND mine.objid OPERATOR(pg_catalog.=) $5::integer::pg_catalog.oid
        ) AS node_held`,

    // Leaving the queue (the lock was taken another way): our node and
    // the marker. $1 queue, $2 ticket, $3 the session's nonce.
    unlockNode: `SELECT
        pg_catalog.pg_advisory_unlock(${
      guarded("$1::integer", "integer", 3)
    }, $2::integer) AS ok,
        pg_catalog.pg_advisory_unlock_shared(${
      guarded("$1::integer", "integer", 3)
    }, 0) AS unmarked`,
  };
}
