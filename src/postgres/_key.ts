// Lock names to PostgreSQL advisory keys.
import { createHash } from "node:crypto";

/**
 * The 64-bit advisory key of a lock name in a schema, as a signed bigint
 * (docs/postgres.md, "How it works"). Advisory locks are per database, so
 * the schema is hashed in, except in `public`, which keeps the name-only
 * key that runlock versions without schemas use, for rolling upgrades
 * (their holders in other schemas must be stopped first). Neither a name
 * nor a schema holds NUL, so the two forms never meet. Colliding names
 * are detected (the table's UNIQUE key), never share a lock.
 *
 * @param name The lock name.
 * @param schema The schema of the pgLocks object (its `schema` option).
 * @returns The advisory key.
 */
export function keyOf(name: string, schema: string): bigint {
  const input = schema === "public"
    ? `runlock\0${name}`
    : `runlock\0${schema}\0${name}`;
  let key = cache.get(input);
  if (key === undefined) {
    key = hash(input);
    if (cache.size >= 256) cache.clear(); // bounded; names repeat in practice
    cache.set(input, key);
  }
  return key;
}

const cache = new Map<string, bigint>();

function hash(input: string): bigint {
  const digest = createHash("sha256").update(input).digest();
  return new DataView(digest.buffer, digest.byteOffset, 8).getBigInt64(0);
}

/** A bigint advisory key as pg_locks shows it (see {@linkcode lockTagOf}). */
export interface LockTag {
  classid: string;
  objid: string;
}

/**
 * How pg_locks shows a bigint advisory key: the high half in `classid`, the
 * low half in `objid` (both unsigned 32-bit oids), `objsubid` 1.
 *
 * @param key The advisory key.
 * @returns The key's two halves, as decimal strings.
 */
export function lockTagOf(key: bigint): LockTag {
  const unsigned = BigInt.asUintN(64, key);
  return {
    classid: String(unsigned >> 32n),
    objid: String(unsigned & 0xffffffffn),
  };
}
