/*
 * admin_status.h - hatchkv-admin's `status` and `health` (admin_status.c):
 * a report (terse: one line) on stdout, as text or JSON; returns the exit
 * status, 0 healthy, 1 degraded, 2 down.
 */
#ifndef HKV_ADMIN_STATUS_H
#define HKV_ADMIN_STATUS_H

struct hkv_etcd;

/* A cluster, from one read of its PREFIX/ in etcd (uri: for the report). */
int hkv_admin_status_cluster(struct hkv_etcd *e, const char *uri, int json, int terse);
/* A standalone server (shm:PATH or verbs://HOST:PORT), by connecting to it
 * with the token in token_file (a read-only token will do). */
int hkv_admin_status_server(const char *uri, const char *token_file, int json, int terse);

#endif /* HKV_ADMIN_STATUS_H */
