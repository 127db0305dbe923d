/*
 * slurm_ft_spank.c -- SPANK plugin of slurm-ft: the `--ft...` options of sbatch/srun/salloc.
 *
 * Loaded by sbatch/salloc/srun (allocator/local context, as the submitting user) and by
 * slurmstepd (remote context, as root, then per task as the job's user) through plugstack.conf:
 *     optional /path/to/slurm_ft_spank.so
 * Reads only its own option values; never the job's environment, never runs a shell or a command.
 *
 * Options (an --ft-* option implies --ft):
 *   --ft                       enable slurm-ft fault tolerance for the job
 *   --ft-retries=N             failover budget, 0..100 (default: the site's [failover] retries;
 *                              job_submit.lua refuses more than the site's [failover] max_retries)
 *   --ft-ckpt-signal=SIG       checkpoint signal: USR1 USR2 HUP INT TERM ALRM URG WINCH (default USR1)
 *   --ft-ckpt-wait=SECONDS     bounded wait for the exit checkpoint, 1..3600 (default 600)
 *   --ft-hang-timeout=DURATION hang window: N, Ns, Nm, Nh or [H:]M:S; 60 s .. 7 days (default unset)
 * An invalid value is fatal at submit time, with a message naming the option.
 *
 * Where the values go (verified on 22.05, see docs/spank.md):
 *   - slurm_spank_init_post_opt (sbatch/salloc/srun) -> spank_job_control_setenv FT, FT_RETRIES,
 *     FT_CKPT_SIGNAL, FT_CKPT_WAIT, FT_HANG_TIMEOUT, FT_RETRIES_GIVEN: job_submit.lua sees them in
 *     job_desc.spank_job_env, Prolog/Epilog as SPANK_FT_*, the job as SLURM_SPANK_FT_*;
 *     FT_RETRIES_GIVEN=0 (no --ft-retries): FT_RETRIES is a placeholder and job_submit.lua
 *     applies the site default ([failover] retries) and checks the site maximum;
 *   - slurm_spank_user_init (slurmstepd, every step) -> spank_setenv SLURM_FT_* in every task
 *     (SLURM_FT_RETRIES only when --ft-retries was given).
 *
 * Attempt marker (slurm_spank_task_init, as the job's user, batch step task 0 of a restarted job,
 * i.e. SLURM_RESTART_COUNT set): one line into the job's own output, e.g.
 *     slurm-ft: attempt 2/4 on n2 after hardware fault (Xid 79, GPU 0000:10:00) on n1; budget 2 left
 * The text comes from the job's AdminComment (written by the slurm-ft daemon only; an owner cannot
 * set it), read with Slurm's own API (slurm_load_job, resolved in slurmstepd's libslurmfull with
 * dlsym: no link-time dependency) as the job's user, one RPC per restarted attempt. Only the part
 * from the word "attempt" up to the options record (a word starting "ft:" or "slurm-ft-") is shown, at most
 * MARKER_MAX bytes, printable ASCII only. Any failure prints nothing and never fails the task.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <unistd.h>
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <slurm/slurm.h>
#include <slurm/spank.h>

SPANK_PLUGIN(slurm_ft, 1);

#define PFX "slurm_ft: "
#define RETRIES_MAX 100
#define WAIT_MAX 3600
#define HANG_MIN 60L
#define HANG_MAX (7L * 24 * 3600)

enum { OPT_FT = 1, OPT_RETRIES, OPT_SIGNAL, OPT_WAIT, OPT_HANG };

static const struct { const char *name; int num; } ft_signals[] = {
	{ "USR1", SIGUSR1 }, { "USR2", SIGUSR2 }, { "HUP", SIGHUP }, { "INT", SIGINT },
	{ "TERM", SIGTERM }, { "ALRM", SIGALRM }, { "URG", SIGURG }, { "WINCH", SIGWINCH },
};
#define N_SIGNALS (sizeof(ft_signals) / sizeof(ft_signals[0]))

static int ft_enabled;
static long ft_retries = 3;    /* placeholder unless ft_retries_given: the site default applies */
static int ft_retries_given;
static int ft_signal = 0;      /* index into ft_signals */
static long ft_wait = 600;
static long ft_hang = 0;       /* 0 = unset */

static int opt_cb(int val, const char *optarg, int remote);

static struct spank_option ft_options[] = {
	{ "ft", NULL, "Enable slurm-ft: requeue on hardware faults, checkpoint before exit.",
	  0, OPT_FT, opt_cb },
	{ "ft-retries", "N", "slurm-ft failover budget, 0..100 (default and maximum: the site's). "
	  "Implies --ft.",
	  1, OPT_RETRIES, opt_cb },
	{ "ft-ckpt-signal", "SIG", "Signal asking the job to checkpoint before it is ended: USR1 "
	  "(default), USR2, HUP, INT, TERM, ALRM, URG, WINCH. Implies --ft.", 1, OPT_SIGNAL, opt_cb },
	{ "ft-ckpt-wait", "SECONDS", "How long slurm-ft waits for the exit checkpoint, 1..3600 "
	  "(default 600). Implies --ft.", 1, OPT_WAIT, opt_cb },
	{ "ft-hang-timeout", "DURATION", "Hang detection window: N[s|m|h] or [H:]M:S, 60 s..7 days. "
	  "Implies --ft.", 1, OPT_HANG, opt_cb },
	SPANK_OPTIONS_TABLE_END
};

/* A whole-string decimal integer in [lo, hi]; 0 on success. */
static int parse_long(const char *s, long lo, long hi, long *out)
{
	char *end;
	long v;

	if (s == NULL || *s == '\0' || isspace((unsigned char)*s))
		return -1;
	errno = 0;
	v = strtol(s, &end, 10);
	if (errno != 0 || *end != '\0' || v < lo || v > hi)
		return -1;
	*out = v;
	return 0;
}

/* USR2, SIGUSR2, usr2 or 12 -> index into ft_signals; -1 if not allowed. */
static int parse_signal(const char *s)
{
	size_t i;
	long num;

	if (s == NULL)
		return -1;
	if (parse_long(s, 1, 64, &num) == 0) {
		for (i = 0; i < N_SIGNALS; i++)
			if (ft_signals[i].num == num)
				return (int)i;
		return -1;
	}
	if (strncasecmp(s, "SIG", 3) == 0)
		s += 3;
	for (i = 0; i < N_SIGNALS; i++)
		if (strcasecmp(s, ft_signals[i].name) == 0)
			return (int)i;
	return -1;
}

/* N, Ns, Nm, Nh, M:S or H:M:S -> seconds; -1 if malformed. */
static long parse_duration(const char *s)
{
	long parts[3], v, mult = 1;
	int n = 0;
	const char *p = s;
	char *end;

	if (s == NULL || !isdigit((unsigned char)*s))
		return -1;
	if (strchr(s, ':') == NULL) {
		errno = 0;
		v = strtol(s, &end, 10);
		if (errno != 0)
			return -1;
		if (*end == 's' || *end == 'm' || *end == 'h') {
			mult = *end == 's' ? 1 : (*end == 'm' ? 60 : 3600);
			end++;
		}
		if (*end != '\0' || v > HANG_MAX)
			return -1;
		return v * mult;
	}
	while (n < 3) {
		if (!isdigit((unsigned char)*p))
			return -1;
		errno = 0;
		v = strtol(p, &end, 10);
		if (errno != 0 || v > HANG_MAX)
			return -1;
		parts[n++] = v;
		if (*end == '\0')
			break;
		if (*end != ':')
			return -1;
		p = end + 1;
	}
	if (*end != '\0' || n < 2)
		return -1;
	if (n == 2)
		return parts[0] * 60 + parts[1];
	return parts[0] * 3600 + parts[1] * 60 + parts[2];
}

static int opt_cb(int val, const char *optarg, int remote)
{
	long v;
	int sig;

	(void)remote;
	ft_enabled = 1;
	switch (val) {
	case OPT_FT:
		return 0;
	case OPT_RETRIES:
		if (parse_long(optarg, 0, RETRIES_MAX, &v) != 0) {
			slurm_error(PFX "--ft-retries=%s: must be an integer 0..%d (0 = never requeue)",
				    optarg ? optarg : "", RETRIES_MAX);
			return -1;
		}
		ft_retries = v;
		ft_retries_given = 1;
		return 0;
	case OPT_SIGNAL:
		sig = parse_signal(optarg);
		if (sig < 0) {
			slurm_error(PFX "--ft-ckpt-signal=%s: unknown or not allowed; use one of USR1 USR2 "
				    "HUP INT TERM ALRM URG WINCH", optarg ? optarg : "");
			return -1;
		}
		ft_signal = sig;
		return 0;
	case OPT_WAIT:
		if (parse_long(optarg, 1, WAIT_MAX, &v) != 0) {
			slurm_error(PFX "--ft-ckpt-wait=%s: must be whole seconds 1..%d",
				    optarg ? optarg : "", WAIT_MAX);
			return -1;
		}
		ft_wait = v;
		return 0;
	case OPT_HANG:
		v = parse_duration(optarg);
		if (v < HANG_MIN || v > HANG_MAX) {
			slurm_error(PFX "--ft-hang-timeout=%s: must be a duration N[s|m|h] or [H:]M:S "
				    "between 60 s and 7 days", optarg ? optarg : "");
			return -1;
		}
		ft_hang = v;
		return 0;
	default:
		slurm_error(PFX "unknown option id %d", val);
		return -1;
	}
}

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	size_t i;

	(void)ac;
	(void)av;
	for (i = 0; ft_options[i].name != NULL; i++) {
		if (spank_option_register(sp, &ft_options[i]) != ESPANK_SUCCESS) {
			slurm_error(PFX "cannot register option --%s", ft_options[i].name);
			return -1;
		}
	}
	return 0;
}

#define N_VALUES 6
#define RETRIES_VALUE 1    /* index of the retry budget in ft_values() */

/* name=value pairs in the order both setters use; returns the count. */
static int ft_values(char vals[N_VALUES][32])
{
	snprintf(vals[0], 32, "1");
	snprintf(vals[RETRIES_VALUE], 32, "%ld", ft_retries);
	snprintf(vals[2], 32, "%s", ft_signals[ft_signal].name);
	snprintf(vals[3], 32, "%ld", ft_wait);
	snprintf(vals[4], 32, "%ld", ft_hang);
	snprintf(vals[5], 32, "%d", ft_retries_given);
	return N_VALUES;
}

static const char *const job_names[N_VALUES] = {
	"FT", "FT_RETRIES", "FT_CKPT_SIGNAL", "FT_CKPT_WAIT", "FT_HANG_TIMEOUT", "FT_RETRIES_GIVEN"
};
/* NULL: not passed to tasks. */
static const char *const task_names[N_VALUES] = {
	"SLURM_FT_ENABLED", "SLURM_FT_RETRIES", "SLURM_FT_CKPT_SIGNAL", "SLURM_FT_CKPT_WAIT",
	"SLURM_FT_HANG_TIMEOUT", NULL
};

/* sbatch/salloc (allocator) and srun (local): hand the values to the job's control environment. */
int slurm_spank_init_post_opt(spank_t sp, int ac, char **av)
{
	char vals[N_VALUES][32];
	int i, n;
	spank_context_t ctx = spank_context();

	(void)ac;
	(void)av;
	if (!ft_enabled || (ctx != S_CTX_ALLOCATOR && ctx != S_CTX_LOCAL))
		return 0;
	n = ft_values(vals);
	for (i = 0; i < n; i++) {
		spank_err_t rc = spank_job_control_setenv(sp, job_names[i], vals[i], 1);
		if (rc != ESPANK_SUCCESS) {
			/* srun inside an existing allocation creates no job: nothing to set. */
			if (ctx == S_CTX_LOCAL)
				return 0;
			slurm_error(PFX "cannot pass %s to the job: %s", job_names[i], spank_strerror(rc));
			return -1;
		}
	}
	return 0;
}

/* slurmstepd, as the job's user, before the tasks start: SLURM_FT_* in every task's environment. */
int slurm_spank_user_init(spank_t sp, int ac, char **av)
{
	char vals[N_VALUES][32], num[16];
	int i, n;

	(void)ac;
	(void)av;
	if (!ft_enabled || !spank_remote(sp))
		return 0;
	n = ft_values(vals);
	for (i = 0; i < n; i++) {
		if (task_names[i] == NULL || (i == RETRIES_VALUE && !ft_retries_given))
			continue;
		if (spank_setenv(sp, task_names[i], vals[i], 1) != ESPANK_SUCCESS) {
			slurm_error(PFX "cannot set %s for the job's tasks", task_names[i]);
			return -1;
		}
	}
	snprintf(num, sizeof(num), "%d", ft_signals[ft_signal].num);
	if (spank_setenv(sp, "SLURM_FT_CKPT_SIGNUM", num, 1) != ESPANK_SUCCESS) {
		slurm_error(PFX "cannot set SLURM_FT_CKPT_SIGNUM for the job's tasks");
		return -1;
	}
	return 0;
}

#define MARKER_MAX 400
#define LEADER "slurm-ft:"

/* The sentence in an AdminComment ("slurm-ft:<state> attempt N/M after ... ft:...") -> out:
 * "slurm-ft: attempt N/M on NODE after ...", printable ASCII only; 0 if there is one and it is
 * about attempt number `number` (a sentence left from an earlier requeue is not shown). */
static int format_marker(const char *admin, long number, const char *node, char *out, size_t size)
{
	const char *p, *end, *other, *num_end;
	char sentence[MARKER_MAX + 1], *num_stop;
	size_t n = 0;

	if (admin == NULL || strncmp(admin, LEADER, strlen(LEADER)) != 0)
		return -1;
	p = strstr(admin, " attempt ");
	if (p == NULL)
		return -1;
	p++;
	if (strtol(p + strlen("attempt "), &num_stop, 10) != number || num_stop == p + strlen("attempt "))
		return -1;
	end = strstr(p, " ft:");
	if (end == NULL)
		end = p + strlen(p);
	other = strstr(p, " slurm-ft-");  /* a record slurm-ft keeps after it (not for the user) */
	if (other != NULL && other < end)
		end = other;
	for (; p < end && n < MARKER_MAX; p++)
		sentence[n++] = (*p >= 0x20 && *p <= 0x7e) ? *p : '?';
	sentence[n] = '\0';
	/* after "attempt N[/M]": the node this attempt runs on */
	num_end = strchr(sentence + strlen("attempt "), ' ');
	if (num_end == NULL)
		num_end = sentence + n;
	snprintf(out, size, "slurm-ft: %.*s on %s%s\n", (int)(num_end - sentence), sentence,
		 node, num_end);
	return 0;
}

typedef int (*load_job_fn)(job_info_msg_t **, uint32_t, uint16_t);
typedef void (*free_job_fn)(job_info_msg_t *);

/* slurmstepd, as the job's user, in each task before exec: the attempt marker (see the header). */
int slurm_spank_task_init(spank_t sp, int ac, char **av)
{
	uint32_t job_id = 0, step_id = 0, task_id = 1;
	long restart_count = 0;
	char restarts[16], node[64], line[MARKER_MAX + 128];
	job_info_msg_t *msg = NULL;
	load_job_fn load_job;
	free_job_fn free_job;
	size_t i;

	(void)ac;
	(void)av;
	if (!ft_enabled || !spank_remote(sp))
		return 0;
	if (spank_get_item(sp, S_JOB_STEPID, &step_id) != ESPANK_SUCCESS || step_id != SLURM_BATCH_SCRIPT
	    || spank_get_item(sp, S_TASK_GLOBAL_ID, &task_id) != ESPANK_SUCCESS || task_id != 0
	    || spank_get_item(sp, S_JOB_ID, &job_id) != ESPANK_SUCCESS)
		return 0;
	if (spank_getenv(sp, "SLURM_RESTART_COUNT", restarts, sizeof(restarts)) != ESPANK_SUCCESS
	    || parse_long(restarts, 1, INT_MAX, &restart_count) != 0)
		return 0;
	if (spank_getenv(sp, "SLURMD_NODENAME", node, sizeof(node)) != ESPANK_SUCCESS)
		snprintf(node, sizeof(node), "?");
	for (i = 0; node[i] != '\0'; i++)
		if (!isalnum((unsigned char)node[i]) && node[i] != '-' && node[i] != '.' && node[i] != '_')
			node[i] = '?';
	load_job = (load_job_fn)dlsym(RTLD_DEFAULT, "slurm_load_job");
	free_job = (free_job_fn)dlsym(RTLD_DEFAULT, "slurm_free_job_info_msg");
	if (load_job == NULL || free_job == NULL)
		return 0;
	if (load_job(&msg, job_id, SHOW_DETAIL) != 0 || msg == NULL)
		return 0;
	if (msg->record_count >= 1
	    && format_marker(msg->job_array[0].admin_comment, restart_count + 1, node, line,
			     sizeof(line)) == 0) {
		ssize_t w = write(STDOUT_FILENO, line, strlen(line));
		(void)w;
	}
	free_job(msg);
	return 0;
}
