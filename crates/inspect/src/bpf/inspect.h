/* Shared between the BPF programs and the Rust decoder (crates/inspect/src/event.rs).
 * Change both together, and bump EVENT_VERSION when the layout changes. */
#ifndef DRUMS_INSPECT_H
#define DRUMS_INSPECT_H

#define EVENT_VERSION 1

/* What an event says happened. Values are part of the event format. */
enum ev_op {
	EV_OPEN_WRITE = 1, /* a regular file opened for writing (maybe created) */
	EV_WRITE = 2,      /* first write-like call on a file in this window */
	EV_TRUNCATE = 3,
	EV_RENAME = 4,
	EV_UNLINK = 5,
	EV_RMDIR = 6,
	EV_MKDIR = 7,
	EV_MKNOD = 8,
	EV_LINK = 9,
	EV_SYMLINK = 10,
	EV_CHMOD = 11,
	EV_CHOWN = 12,
	EV_XATTR = 13,
	EV_UTIMES = 14,
	EV_MMAP_SHARED = 15, /* a shared mapping of a file opened for writing */
	EV_IOCTL = 16,       /* an inode-flag ioctl (chattr) */
	EV_OPAQUE = 17,      /* io_uring, mount: effects syscalls cannot see */
	EV_MEMWRITE = 18,    /* process_vm_writev or ptrace into another process */
	EV_IPC = 19,         /* System V or POSIX IPC objects: kernel state CRIU dumps */
	EV_FORK = 32,
	EV_EXEC = 33,
	EV_EXIT = 34,
};

/* Event flags. */
#define F_CREATED 0x1     /* the open created the file (FMODE_CREATED) */
#define F_UNREADABLE 0x2  /* a user string or kernel path could not be read */
#define F_TRUNCATED 0x4   /* a path was longer than the event holds */
#define F_DIR 0x8         /* the object is a directory */
#define F_GROUP_DEAD 0x10 /* exit: the last thread of the process */
#define F_THREAD 0x20     /* fork: a new thread, not a new process */

/* Four fields follow the header, back to back:
 *   name1: a user-supplied path as given (absolute or relative), NUL-terminated;
 *   base1: the directory a relative name1 is resolved in, or for an operation on
 *          an open file that file's own path: its components from the leaf up to
 *          the session root, each NUL-terminated, then an empty component;
 *   name2, base2: the same for a second path (rename, link).
 * lens[] gives each field's byte length including its terminators. An exec's
 * name1 is the program's path; an opaque event's name1 says what it was. */
struct event_hdr {
	unsigned short version;
	unsigned short op;
	unsigned int flags;
	unsigned long long cgroup;
	unsigned long long epoch; /* the cgroup's epoch when the event happened */
	unsigned int pid;  /* thread id */
	unsigned int tgid; /* process id */
	unsigned int ppid; /* fork: parent tgid; memwrite: target pid */
	int ret;
	char comm[16];
	unsigned short lens[4];
};

/* One record per task of a watched cgroup, written by the task iterator. */
struct task_rec {
	unsigned long long cgroup;
	unsigned long long start_time; /* ns since boot: with tgid, a process's identity */
	unsigned long long runtime_ns;
	unsigned long long switches; /* voluntary + involuntary */
	unsigned long long faults;   /* minor + major */
	unsigned int pid;
	unsigned int tgid;
	unsigned int ppid; /* parent's tgid */
	int ns_tgid;       /* the process's pid inside its own pid namespace */
	char comm[16];
};

#endif
