/**
 * Where the commands' locks are: lock files, or a PostgreSQL database when
 * the options name one (see `_postgres.ts`).
 *
 * @module
 */

import { acquire, type AcquireOptions, HeldError, inspect } from "../../mod.ts";
import type { HeldLock, Locks } from "../contract.ts";
import { CHILD_OPTION } from "../file/_inherit.ts";
import type { Info } from "./_format.ts";
import { checkLockPath } from "./_paths.ts";
import { openLocks, pgInfo, postgres, type Url } from "./_postgres.ts";
import { setupAdvice } from "./_setup_advice.ts";

/** One backend's locks, as the commands use them. */
export interface Backend
  extends Pick<Locks<HeldLock, Info>, "acquire" | "inspect"> {
  /** Throws when `name` cannot name a lock here, before anything looks. */
  check(name: string): void;
  /** Whether `err` says that another run holds the lock. */
  isHeld(err: unknown): err is Error;
  /** The longest pause between two probes of `wait`, in ms. */
  poll: number;
  end(): Promise<void>;
}

const files: Backend = {
  check: checkLockPath,
  inspect,
  // checkInterval: one lstat, so a lost lock is noticed within 200 ms even
  // where no directory watch runs (Deno's would keep the process alive).
  // CHILD_OPTION: a `child=` line for the command's PID (PROTOCOL.md,
  // "Handing the lock to a command").
  acquire: (path, options) =>
    acquire(path, {
      ...options,
      checkInterval: 200,
      [CHILD_OPTION]: true,
    } as AcquireOptions),
  isHeld: (err): err is Error => err instanceof HeldError,
  poll: 100,
  end: () => Promise.resolve(),
};

async function database(url: Url): Promise<Backend> {
  const pg = await postgres();
  const locks = await openLocks(url);
  const info = pgInfo();
  return {
    check: () => {},
    inspect: async (name) => info(await locks.inspect(name)),
    // Only acquire may meet a role that cannot create runlock's table.
    acquire: (name, options) =>
      locks.acquire(name, options).catch((err) => {
        throw setupAdvice(err, name);
      }),
    isHeld: (err): err is Error =>
      err instanceof pg.HeldError || err instanceof HeldError,
    poll: 250,
    end: () => locks.end(),
  };
}

/** The backend the options ask for. */
export function backend(url: Url | undefined): Promise<Backend> {
  return url === undefined ? Promise.resolve(files) : database(url);
}
