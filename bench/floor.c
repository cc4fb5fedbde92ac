/*
 * The physical floor of runlock's protocol: the system calls of one
 * acquire+release and of one probe (PROTOCOL.md), made directly from C,
 * and nothing else. bench/bench.ts compiles this with `cc -O2` at run time
 * and compares every runtime against it, measured in the same run.
 *
 *   floor serve [mark]  timing server: reads "<case> <n> <path>" lines on
 *                       stdin, runs the case n times, prints the mean cost of
 *                       one run in nanoseconds (one number per line). With
 *                       "mark", each batch is bracketed by a failing
 *                       access("<path>.runlock-bench-mark-<case>-begin") and
 *                       "...-end", so that an strace of it can be cut per case
 *
 * Cases (each mirrors the protocol, not runlock's implementation):
 *   acquire        open(T, O_RDWR|O_CREAT|O_EXCL|O_CLOEXEC, 0644),
 *                  flock(LOCK_EX|LOCK_NB), write(record), link(T, P),
 *                  unlink(T), fstat (remember dev, ino); release: lstat(P)
 *                  and compare, unlink(P), close
 *   probe          open(P, O_RDONLY|O_NOFOLLOW|O_NONBLOCK|O_NOCTTY|O_CLOEXEC),
 *                  flock(LOCK_SH|LOCK_NB), read, close: what inspect() needs
 *   probe_noread   open, flock(LOCK_SH|LOCK_NB), close: what held() needs
 *                  when the flock answers (a held lock, or a free one:
 *                  close drops a shared lock without LOCK_UN)
 *   probe_missing  open, which fails with ENOENT: a free lock (no file)
 *   probe_held     the 6 calls runlock's held() makes on a held lock: open,
 *                  fstat, flock(LOCK_SH|LOCK_NB), pread (32 bytes: the PID),
 *                  kill(pid, 0), close. Not a floor: what the protocol's
 *                  checks cost from C, beside the floor
 *   probe_inspect  the same with the whole record read: inspect()'s 6 calls
 *   scan           opendir(P), then for every entry the probe above
 *                  (openat, flock, read, close), closedir: n scans
 *
 *   floor many <dir> <count> <block>  takes <count> locks in <dir> (the
 *                       acquire above, without its release: every lock stays
 *                       held), names lock-000000.lock and on, and prints
 *                       the mean microseconds per acquisition of each block
 *                       of <block>, on one line; then releases them all
 *
 *   floor waitlock <path>  the floor of a hand-off after SIGKILL: opens
 *                       the lock file, prints "waiting", blocks in
 *                       flock(LOCK_EX) (the kernel wakes it when the
 *                       holder's descriptor is closed, by its death), prints
 *                       "woke", and exits at the end of its stdin
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAX_RECORD 4096

static char host[256];
static int pid; /* cached, as runlock caches it: glibc does not */
static unsigned long serial;

static void die(const char *what, const char *path) {
  fprintf(stderr, "floor: %s %s: %s\n", what, path, strerror(errno));
  exit(1);
}

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* The record runlock writes: PID, marker, host, start time, runtime. */
static int format_record(char *buf, size_t size) {
  struct timespec ts;
  struct tm tm;
  char when[32];
  clock_gettime(CLOCK_REALTIME, &ts);
  gmtime_r(&ts.tv_sec, &tm);
  strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
  return snprintf(buf, size, "%d\nrunlock 1\nhost=%s\nstarted=%s.%03ldZ\nruntime=c\n",
                  pid, host, when, ts.tv_nsec / 1000000);
}

struct held {
  int fd;
  dev_t dev;
  ino_t ino;
};

/* Protocol steps 1 and 2, uncontended: temp file, LOCK_EX, record, link. */
static int take(const char *path, struct held *out) {
  char temp[8320], record[MAX_RECORD];
  const char *slash = strrchr(path, '/');
  int dirlen = slash ? (int)(slash - path) : 1;
  const char *name = slash ? slash + 1 : path;
  snprintf(temp, sizeof temp, "%.*s/.%s.%08x%08lx.tmp", dirlen,
           slash ? path : ".", name, (unsigned)pid, serial++);
  int fd = open(temp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) die("open", temp);
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) die("flock", temp);
  int len = format_record(record, sizeof record);
  if (write(fd, record, (size_t)len) != len) die("write", temp);
  if (link(temp, path) != 0) {
    int err = errno;
    unlink(temp);
    close(fd);
    errno = err;
    return -1;
  }
  if (unlink(temp) != 0) die("unlink", temp);
  struct stat st;
  if (fstat(fd, &st) != 0) die("fstat", temp);
  out->fd = fd;
  out->dev = st.st_dev;
  out->ino = st.st_ino;
  return 0;
}

/* Release: unlink only if the path still names our inode, then close. */
static void give_back(const char *path, struct held *lock) {
  struct stat st;
  if (lstat(path, &st) == 0 && st.st_dev == lock->dev && st.st_ino == lock->ino) {
    if (unlink(path) != 0) die("unlink", path);
  }
  close(lock->fd);
}

static void acquire_release(const char *path) {
  struct held lock;
  if (take(path, &lock) != 0) die("link", path);
  give_back(path, &lock);
}

static char probe_buf[MAX_RECORD + 1];

/* Returns 1 when held, 0 when not, -1 when missing. */
static int probe_at(int dirfd, const char *path, int want_read) {
  int fd = openat(dirfd, path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return -1;
    die("open", path);
  }
  int held = flock(fd, LOCK_SH | LOCK_NB) != 0;
  if (held && errno != EWOULDBLOCK) die("flock", path);
  if (want_read && read(fd, probe_buf, sizeof probe_buf) < 0) die("read", path);
  close(fd); /* drops our LOCK_SH, if we got it */
  return held;
}

/*
 * The 6 calls runlock's probe makes on a held lock (PROTOCOL.md, Probes):
 * the open, an fstat (only a regular file is a lock: O_NONBLOCK opens a
 * FIFO or a device too), the shared flock, the read (held(): the first 32
 * bytes, for the PID; inspect(): the record), kill(pid, 0) (a dead PID
 * under a held flock is a takeover in progress), the close.
 */
static void probe_runlock(const char *path, size_t want) {
  int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) die("open", path);
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) die("fstat", path);
  if (flock(fd, LOCK_SH | LOCK_NB) == 0 || errno != EWOULDBLOCK) die("flock (not held)", path);
  ssize_t n = pread(fd, probe_buf, want, 0);
  if (n <= 0) die("pread", path);
  probe_buf[n < (ssize_t)want ? n : (ssize_t)want - 1] = 0;
  long holder = strtol(probe_buf, NULL, 10);
  if (holder <= 0 || kill((pid_t)holder, 0) != 0) die("kill", path);
  close(fd);
}

static void scan(const char *dir) {
  DIR *d = opendir(dir);
  if (d == NULL) die("opendir", dir);
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.') continue;
    probe_at(dirfd(d), e->d_name, 1);
  }
  closedir(d);
}

static void mark(int on, const char *path, const char *name, const char *when) {
  char marker[4200];
  if (!on) return;
  snprintf(marker, sizeof marker, "%s.runlock-bench-mark-%s-%s", path, name, when);
  access(marker, F_OK);
}

static int serve(int marks) {
  char line[8192], name[64], path[4096];
  long n;
  setvbuf(stdout, NULL, _IOLBF, 0);
  while (fgets(line, sizeof line, stdin) != NULL) {
    if (sscanf(line, "%63s %ld %4095[^\n]", name, &n, path) != 3 || n < 1) {
      fprintf(stderr, "floor: bad request: %s", line);
      return 2;
    }
    mark(marks, path, name, "begin");
    double start = now_ns();
    if (strcmp(name, "acquire") == 0) {
      for (long i = 0; i < n; i++) acquire_release(path);
    } else if (strcmp(name, "probe") == 0) {
      for (long i = 0; i < n; i++) probe_at(AT_FDCWD, path, 1);
    } else if (strcmp(name, "probe_noread") == 0) {
      for (long i = 0; i < n; i++) probe_at(AT_FDCWD, path, 0);
    } else if (strcmp(name, "probe_held") == 0) {
      for (long i = 0; i < n; i++) probe_runlock(path, 32);
    } else if (strcmp(name, "probe_inspect") == 0) {
      for (long i = 0; i < n; i++) probe_runlock(path, sizeof probe_buf);
    } else if (strcmp(name, "probe_missing") == 0) {
      for (long i = 0; i < n; i++) probe_at(AT_FDCWD, path, 0);
    } else if (strcmp(name, "scan") == 0) {
      for (long i = 0; i < n; i++) scan(path);
    } else {
      fprintf(stderr, "floor: unknown case %s\n", name);
      return 2;
    }
    double elapsed = now_ns() - start;
    mark(marks, path, name, "end");
    printf("%.1f\n", elapsed / (double)n);
  }
  return 0;
}

static int many(const char *dir, long count, long block) {
  struct held *locks = calloc((size_t)count, sizeof *locks);
  char path[4200];
  if (locks == NULL) die("calloc", dir);
  double start = now_ns();
  for (long i = 0; i < count; i++) {
    snprintf(path, sizeof path, "%s/lock-%06ld.lock", dir, i);
    if (take(path, &locks[i]) != 0) die("link", path);
    if ((i + 1) % block == 0) {
      double end = now_ns();
      printf("%s%.1f", i + 1 == block ? "" : " ", (end - start) / 1e3 / (double)block);
      start = end;
    }
  }
  printf("\n");
  for (long i = 0; i < count; i++) {
    snprintf(path, sizeof path, "%s/lock-%06ld.lock", dir, i);
    give_back(path, &locks[i]);
  }
  free(locks);
  return 0;
}

int main(int argc, char **argv) {
  pid = (int)getpid();
  if (gethostname(host, sizeof host) != 0) host[0] = '\0';
  char warm[MAX_RECORD];
  format_record(warm, sizeof warm); /* loads the time zone once, not in a batch */
  if (argc >= 2 && strcmp(argv[1], "serve") == 0) {
    return serve(argc == 3 && strcmp(argv[2], "mark") == 0);
  }
  if (argc == 3 && strcmp(argv[1], "waitlock") == 0) {
    int fd = open(argv[2], O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return 1;
    if (write(1, "waiting\n", 8) != 8) return 1;
    if (flock(fd, LOCK_EX) != 0) return 1;
    if (write(1, "woke\n", 5) != 5) return 1;
    char c;
    while (read(0, &c, 1) > 0) {
    }
    return 0;
  }
  if (argc == 5 && strcmp(argv[1], "many") == 0) {
    long count = atol(argv[3]), block = atol(argv[4]);
    if (count < 1 || block < 1) return 2;
    return many(argv[2], count, block);
  }
  fprintf(stderr, "usage: floor serve [mark] | floor many <dir> <count> <block> | floor waitlock <path>\n");
  return 2;
}
