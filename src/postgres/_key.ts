// Lock names to PostgreSQL advisory keys.
import { createHash } from "node:crypto";

/**
 * The 64-bit advisory key of a lock name: the first 8 bytes of
 * SHA-256("runlock\0" + name), as a signed bigint (pg_advisory_lock takes a
 * bigint). The prefix is runlock's namespace: other applications that hash
 * their own names into the same bigint key space are unlikely to land on
 * ours, and two runlock names that collide are detected (the table's
 * UNIQUE key), never silently share a lock.
 */
export function keyOf(name: string): bigint {
  let key = cache.get(name);
  if (key === undefined) {
    key = hash(name);
    if (cache.size >= 256) cache.clear(); // bounded; names repeat in practice
    cache.set(name, key);
  }
  return key;
}

const cache = new Map<string, bigint>();

function hash(name: string): bigint {
  const digest = createHash("sha256").update(`runlock\0${name}`).digest();
  return new DataView(digest.buffer, digest.byteOffset, 8).getBigInt64(0);
}

/**
 * How pg_locks shows a bigint advisory key: the high half in `classid`, the
 * low half in `objid` (both unsigned 32-bit oids), `objsubid` 1.
 */
export function lockTagOf(key: bigint): { classid: string; objid: string } {
  const unsigned = BigInt.asUintN(64, key);
  return {
    classid: String(unsigned >> 32n),
    objid: String(unsigned & 0xffffffffn),
  };
}
