/* bertlua — the host program: LuaJIT with cjson built in, the bertlua Lua
 * library on its path, MPI when started by a launcher, a script runner and a
 * REPL (libedit).
 *
 *   bertlua script.lua [args]    run a script (`arg` and `...` as in lua)
 *   bertlua -e 'code'            run a string
 *   bertlua -i [script.lua]      run, then enter the REPL
 *   bertlua -                    run standard input
 *   bertlua                      REPL on a terminal, else run standard input
 *   bertlua --version            versions, BLAS, CPU ISA path, CUDA/NCCL and visible GPUs
 */
#include <errno.h>
#include <limits.h>
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <editline/readline.h>

#include "lauxlib.h"
#include "lua.h"
#include "luajit.h"
#include "lualib.h"
#include "bertlua.h"

int luaopen_cjson(lua_State *L);
int luaopen_cjson_safe(lua_State *L);

static const char *progname = "bertlua";

static int file_exists(const char *p) {
  struct stat st;
  return stat(p, &st) == 0;
}

/* The lua/ tree: next to an installed binary (../share/bertlua/lua), else the
 * source tree this binary was built from. BERTLUA_LUA_DIR overrides both. */
static void find_lua_dir(char *out, size_t n) { /* n >= PATH_MAX + 64 */
  const char *env = getenv("BERTLUA_LUA_DIR");
  if (env && *env) {
    snprintf(out, n, "%s", env);
    return;
  }
  char exe[PATH_MAX];
  ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (len > 0) {
    exe[len] = 0;
    char *slash = strrchr(exe, '/');
    if (slash) {
      *slash = 0;
      char cand[PATH_MAX + 64], probe[PATH_MAX + 96];
      snprintf(cand, sizeof cand, "%s/%s", exe, BL_INSTALL_LUA_REL);
      snprintf(probe, sizeof probe, "%s/bertlua/init.lua", cand);
      if (file_exists(probe)) {
        snprintf(out, n, "%s", cand);
        return;
      }
    }
  }
  snprintf(out, n, "%s", BL_SOURCE_LUA_DIR);
}

/* --debug among the script's arguments, or BERTLUA_DEBUG=1: tracebacks for every error */
static int debug_mode = 0;

/* Whether msg starts with the position ("chunk:line:") of a function on the stack, i.e. was raised by
 * error(msg) or the VM: an internal error. The library raises user errors with level 0 — "op: what was
 * wrong", maybe naming a data file's line ("train.tsv:402: ...") — without one. The message handler runs
 * before the stack unwinds, so the raising function is still there. */
static int has_position(lua_State *L, const char *msg) {
  lua_Debug ar;
  for (int level = 0; level < 200 && lua_getstack(L, level, &ar); level++) {
    if (!lua_getinfo(L, "Sl", &ar) || ar.currentline <= 0) continue;
    char pos[LUA_IDSIZE + 32];
    int n = snprintf(pos, sizeof pos, "%s:%d:", ar.short_src, ar.currentline);
    if (n > 0 && strncmp(msg, pos, (size_t)n) == 0) return 1;
  }
  /* rethrown from a pcall: the raiser is gone, but a Lua file's position still marks an internal error */
  const char *p = strstr(msg, ".lua:");
  if (!p || memchr(msg, ' ', (size_t)(p - msg)) || memchr(msg, '\n', (size_t)(p - msg))) return 0;
  p += 5;
  if (*p < '0' || *p > '9') return 0;
  while (*p >= '0' && *p <= '9') p++;
  return *p == ':';
}

static int traceback(lua_State *L) {
  const char *msg = lua_tostring(L, 1);
  if (!msg) {
    if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING) return 1;
    msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
  }
  if (!debug_mode && !has_position(L, msg)) {
    /* a user error: its one line says what to do; a traceback a caller appended is dropped too */
    const char *tb = strstr(msg, "\nstack traceback:");
    if (tb)
      lua_pushlstring(L, msg, (size_t)(tb - msg));
    else
      lua_pushstring(L, msg);
    return 1;
  }
  luaL_traceback(L, L, msg, 1);
  return 1;
}

static void report(lua_State *L, int status) {
  if (status && !lua_isnil(L, -1)) {
    const char *msg = lua_tostring(L, -1);
    if (!msg) msg = "(error object is not a string)";
    if (bl_dist_size() > 1)
      fprintf(stderr, "%s [rank %d]: %s\n", progname, bl_dist_rank(), msg);
    else
      fprintf(stderr, "%s: %s\n", progname, msg);
    fflush(stderr);
    lua_pop(L, 1);
  }
}

static int docall(lua_State *L, int narg, int nres) {
  int base = lua_gettop(L) - narg;
  lua_pushcfunction(L, traceback);
  lua_insert(L, base);
  int status = lua_pcall(L, narg, nres, base);
  lua_remove(L, base);
  return status;
}

/* A script's output is lost if standard output could not take it (a full disk,
 * /dev/full, a closed pipe): exiting 0 would claim success. Flushes stdout and
 * checks its error flag (and, with do_close, its close); on a failure prints one
 * line and returns 1. */
static int stdout_failed(int do_close) {
  static int reported;
  errno = 0;
  int bad = fflush(stdout) != 0 || ferror(stdout);
  int e = errno;
  if (do_close && fclose(stdout) != 0 && !bad) {
    bad = 1;
    e = errno;
  }
  if (bad && !reported) {
    reported = 1;
    fprintf(stderr, "%s: cannot write the standard output%s%s; the output is incomplete\n", progname, e ? ": " : "",
            e ? strerror(e) : "");
    fflush(stderr);
  }
  return bad;
}

/* os.exit replacement: a failing rank takes the whole MPI job down instead of
 * leaving the others waiting in a collective; a clean exit finalizes MPI. */
static int host_exit(lua_State *L) {
  int code;
  if (lua_isnoneornil(L, 1))
    code = 0;
  else if (lua_isboolean(L, 1))
    code = lua_toboolean(L, 1) ? 0 : 1;
  else
    code = (int)luaL_checkinteger(L, 1);
  if (stdout_failed(0) && code == 0) code = 1;
  fflush(stderr);
  if (code != 0 && code != 77 && bl_dist_size() > 1) bl_dist_abort("exiting with an error", code);
  bl_dist_finalize();
  lua_close(L);
  if (stdout_failed(1) && code == 0) code = 1;
  exit(code);
}

static void setup(lua_State *L, char **argv, int argc, int script_index) {
  luaL_openlibs(L);
  lua_getglobal(L, "package");
  lua_getfield(L, -1, "preload");
  lua_pushcfunction(L, luaopen_cjson);
  lua_setfield(L, -2, "cjson");
  lua_pushcfunction(L, luaopen_cjson_safe);
  lua_setfield(L, -2, "cjson.safe");
  lua_pop(L, 1);
  char dir[PATH_MAX + 64];
  find_lua_dir(dir, sizeof dir);
  lua_getfield(L, -1, "path");
  lua_pushfstring(L, "%s/?.lua;%s/?/init.lua;%s", dir, dir, lua_tostring(L, -1));
  lua_setfield(L, -3, "path");
  lua_pop(L, 2);
  lua_getglobal(L, "os");
  lua_pushcfunction(L, host_exit);
  lua_setfield(L, -2, "exit");
  lua_pop(L, 1);
  /* arg table like lua's: arg[0] = script, arg[1..] = its arguments, arg[-k] = options */
  lua_createtable(L, argc, script_index + 1);
  for (int i = 0; i < argc; i++) {
    lua_pushstring(L, argv[i]);
    lua_rawseti(L, -2, i - script_index);
  }
  lua_setglobal(L, "arg");
}

static int run_chunk(lua_State *L, int status, int nargs_from_arg) {
  if (status == 0) {
    int n = 0;
    if (nargs_from_arg) {
      lua_getglobal(L, "arg");
      for (int i = 1;; i++) {
        lua_rawgeti(L, -1 - n, i);
        if (lua_isnil(L, -1)) {
          lua_pop(L, 1);
          break;
        }
        n++;
      }
      lua_remove(L, -1 - n);
    }
    status = docall(L, n, 0);
  }
  report(L, status);
  return status;
}

/* ---- REPL ---- */
static int incomplete(lua_State *L, int status) {
  if (status == LUA_ERRSYNTAX) {
    size_t lmsg;
    const char *msg = lua_tolstring(L, -1, &lmsg);
    if (lmsg >= 7 && strcmp(msg + lmsg - 7, "'<eof>'") == 0) {
      lua_pop(L, 1);
      return 1;
    }
  }
  return 0;
}

static void repl(lua_State *L) {
  char hist[PATH_MAX] = "";
  const char *home = getenv("HOME");
  if (home) {
    snprintf(hist, sizeof hist, "%s/.bertlua_history", home);
    read_history(hist);
  }
  printf("bertlua %s — %s. Expressions print their value; Ctrl-D exits.\n", bl_version(), LUAJIT_VERSION);
  for (;;) {
    char *line = readline("> ");
    if (!line) break;
    if (!*line) {
      free(line);
      continue;
    }
    size_t cap = strlen(line) + 1;
    char *buf = malloc(cap);
    if (!buf) {
      free(line);
      break;
    }
    memcpy(buf, line, cap);
    free(line);
    int status;
    for (;;) {
      /* first as an expression to print, then as a statement */
      lua_pushfstring(L, "return %s", buf);
      status = luaL_loadbuffer(L, lua_tostring(L, -1), lua_objlen(L, -1), "=stdin");
      lua_remove(L, -2);
      if (status == 0) break;
      lua_pop(L, 1);
      status = luaL_loadbuffer(L, buf, strlen(buf), "=stdin");
      if (!incomplete(L, status)) break;
      char *more = readline(">> ");
      if (!more) break;
      size_t need = strlen(buf) + strlen(more) + 2;
      char *nb = realloc(buf, need);
      if (!nb) {
        free(more);
        break;
      }
      buf = nb;
      strcat(buf, "\n");
      strcat(buf, more);
      free(more);
    }
    add_history(buf);
    free(buf);
    if (status == 0) {
      int base = lua_gettop(L) - 1;
      status = docall(L, 0, LUA_MULTRET);
      if (status == 0 && lua_gettop(L) > base) {
        lua_getglobal(L, "print");
        lua_insert(L, base + 1);
        if (lua_pcall(L, lua_gettop(L) - base - 1, 0, 0)) report(L, 1);
      }
    }
    report(L, status);
    lua_settop(L, 0);
  }
  printf("\n");
  if (*hist) write_history(hist);
}

static void print_version(void) {
  printf("bertlua %s\n", bl_version());
  printf("LuaJIT: %s\n", LUAJIT_VERSION);
  printf("BLAS: %s, %d threads\n", bl_blas_info(), bl_num_threads());
  printf("CPU: %s; GEMM: %s\n", bl_cpu_info(), bl_gemm_backend());
  char mpiv[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(mpiv, &len);
  char *nl = strchr(mpiv, '\n');
  if (nl) *nl = 0;
  printf("MPI: %s\n", mpiv);
  if (!bl_cuda_compiled()) {
    printf("CUDA: not built (CPU-only build)\nNCCL: not built\n");
    return;
  }
  int n = bl_cuda_device_count();
  printf("CUDA: built; %d device(s) visible\n", n);
  for (int i = 0; i < n; i++) {
    char name[256];
    if (bl_cuda_device_name(i, name, sizeof name) == 0) printf("  cuda:%d %s\n", i, name);
  }
  printf("NCCL: %s\n", bl_nccl_compiled() ? "built" : "not built");
}

static void usage(void) {
  printf(
      "usage: %s [options] [script.lua [args]]\n"
      "  -e code     run code\n"
      "  -i          enter the REPL after running the script\n"
      "  -           run standard input\n"
      "  -v, --version  versions of bertlua, LuaJIT, BLAS, MPI, CUDA/NCCL, the CPU's ISA path and GPUs\n"
      "  -h, --help  this text\n"
      "With no script, runs the REPL on a terminal or standard input otherwise.\n",
      progname);
}

/* Idle threads should sleep, not spin: OpenMP's workers (our ops) and
 * OpenBLAS's own pool (the GEMMs) share the same cores, and each pool's
 * spinning between its jobs slows the other down. Measured on 2 cores:
 * OMP_WAIT_POLICY=passive takes a BERT-mini training step from 26 to 36
 * seq/s; OPENBLAS_THREAD_TIMEOUT=4 (OpenBLAS workers sleep after 2^4 cycles
 * idle) another 5-7% on BERT-base. A short spin first (GOMP_SPINCOUNT=10000,
 * ~0.1 ms, then sleep) keeps a batch-1 forward's ~100 short parallel regions
 * from waiting on a woken thread each (p50 214-328 ms -> 110-117 ms under
 * load) and is 2-4% faster on BERT-mini training (BENCHMARKS.md). The
 * libraries read these once, when they are loaded, before main: so the host
 * sets the ones the user has not set and executes itself again.
 * BERTLUA_THREAD_ENV_SET lists what the host set, so a benchmark can start
 * its peer (PyTorch) without it (bl.peer_env_prefix). */
static void prefer_sleeping_threads(char **argv) {
  static const char *const vars[][2] = { { "OMP_WAIT_POLICY", "passive" },
                                         { "GOMP_SPINCOUNT", "10000" },
                                         { "OPENBLAS_THREAD_TIMEOUT", "4" } };
  if (getenv("BERTLUA_THREAD_ENV_SET")) return;
  /* a user's own wait policy (e.g. active) keeps libgomp's spin count for it */
  const int user_policy = getenv("OMP_WAIT_POLICY") != NULL;
  char set[128] = "";
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
    if (getenv(vars[i][0])) continue;
    if (user_policy && strcmp(vars[i][0], "GOMP_SPINCOUNT") == 0) continue;
    setenv(vars[i][0], vars[i][1], 1);
    if (set[0]) strcat(set, " ");
    strcat(set, vars[i][0]);
  }
  setenv("BERTLUA_THREAD_ENV_SET", set[0] ? set : "-", 1);
  if (!set[0]) return;
  execv("/proc/self/exe", argv);
  /* exec failed: carry on with the defaults (slower, not wrong) */
}

int main(int argc, char **argv) {
  /* over a file-size limit (ulimit -f) a write then fails with EFBIG, which the writers report naming the
   * file, instead of the kernel killing us between a temporary's write and its rename */
  signal(SIGXFSZ, SIG_IGN);
  prefer_sleeping_threads(argv);
  int interactive = 0, script = 0, ran_e = 0;
  /* options end at the script name; -e may repeat */
  int i;
  for (i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "-v") == 0 || strcmp(a, "--version") == 0) {
      print_version();
      return 0;
    }
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      usage();
      return 0;
    }
    if (strcmp(a, "-i") == 0) {
      interactive = 1;
      continue;
    }
    if (strcmp(a, "-e") == 0) {
      if (++i >= argc) {
        fprintf(stderr, "%s: -e needs an argument\n", progname);
        return 1;
      }
      continue;
    }
    if (strcmp(a, "--") == 0) {
      i++;
      break;
    }
    if (a[0] == '-' && a[1] != 0) {
      fprintf(stderr, "%s: unknown option %s\n", progname, a);
      usage();
      return 1;
    }
    break;
  }
  script = i < argc ? i : 0;
  const char *dbg = getenv("BERTLUA_DEBUG");
  debug_mode = dbg && *dbg && strcmp(dbg, "0") != 0;
  for (int k = script ? script + 1 : argc; k < argc; k++)
    if (strcmp(argv[k], "--debug") == 0) debug_mode = 1;

  if (bl_dist_init(&argc, &argv) != 0) {
    fprintf(stderr, "%s: %s\n", progname, bl_last_error());
    return 1;
  }
  lua_State *L = luaL_newstate();
  if (!L) {
    fprintf(stderr, "%s: cannot create the Lua state (out of memory)\n", progname);
    return 1;
  }
  setup(L, argv, argc, script ? script : argc);

  int status = 0;
  for (int k = 1; k < (script ? script : argc) && status == 0; k++) {
    if (strcmp(argv[k], "-e") == 0) {
      const char *code = argv[++k];
      status = run_chunk(L, luaL_loadbuffer(L, code, strlen(code), "=(command line)"), 0);
      ran_e = 1;
    }
  }
  if (status == 0 && script) {
    const char *name = strcmp(argv[script], "-") == 0 ? NULL : argv[script];
    status = run_chunk(L, luaL_loadfile(L, name), 1);
  } else if (status == 0 && !ran_e && !interactive) {
    if (isatty(0))
      interactive = 1;
    else
      status = run_chunk(L, luaL_loadfile(L, NULL), 1);
  }
  if (status == 0 && interactive) repl(L);
  if (stdout_failed(0)) status = 1;
  if (status != 0 && bl_dist_size() > 1) bl_dist_abort("uncaught error", 1);
  lua_close(L);
  bl_dist_finalize();
  if (stdout_failed(1)) status = 1;
  return status ? 1 : 0;
}
