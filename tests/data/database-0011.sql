BEGIN TRANSACTION;
CREATE TABLE account_caps (
	account VARCHAR(255) NOT NULL, 
	user_name VARCHAR(255) NOT NULL, 
	monthly_ucr BIGINT NOT NULL, 
	CONSTRAINT pk_account_caps PRIMARY KEY (account, user_name)
);
CREATE TABLE alembic_version (
	version_num VARCHAR(32) NOT NULL, 
	CONSTRAINT alembic_version_pkc PRIMARY KEY (version_num)
);
INSERT INTO "alembic_version" VALUES('0011');
CREATE TABLE assignments (
	id INTEGER NOT NULL, 
	device_uuid VARCHAR(128) NOT NULL, 
	node VARCHAR(253) NOT NULL, 
	user_name VARCHAR(255) NOT NULL, 
	server_name VARCHAR(255) NOT NULL, 
	profile_slug VARCHAR(63) NOT NULL, 
	claimed_at DATETIME NOT NULL, 
	released_at DATETIME, 
	release_reason VARCHAR(64), tier VARCHAR(16) DEFAULT 'on-demand' NOT NULL, reservation_id INTEGER, 
	CONSTRAINT pk_assignments PRIMARY KEY (id)
);
CREATE TABLE audit_log (
	id INTEGER NOT NULL, 
	at DATETIME NOT NULL, 
	actor VARCHAR(255) NOT NULL, 
	action VARCHAR(64) NOT NULL, 
	target VARCHAR(255) NOT NULL, 
	"before" TEXT, 
	"after" TEXT, 
	CONSTRAINT pk_audit_log PRIMARY KEY (id)
);
INSERT INTO "audit_log" VALUES(1,'2026-12-07 00:44:26.185625','admin','profile.create','profile:cpu',NULL,'{"cpu": 2, "description": "No GPU. Reach your files, write code, run small jobs.", "display_name": "CPU only", "enabled": true, "groups": [], "idle_timeout": "30m", "images": ["pytorch", "cuda"], "max_runtime": "0", "memory": "8Gi", "min_run": "10m", "price_per_hour": "0.1", "slug": "cpu"}');
INSERT INTO "audit_log" VALUES(2,'2026-12-07 00:44:26.186948','admin','profile.create','profile:h200-1g',NULL,'{"cpu": 4, "description": "One seventh of an H200, 18 GB of HBM3e", "display_name": "H200 slice (1g.18gb)", "enabled": true, "gpu": {"mig": "1g.18gb", "model": "H200"}, "groups": [], "idle_timeout": "30m", "images": ["pytorch", "tensorrt-llm"], "max_runtime": "0", "memory": "32Gi", "min_run": "10m", "price_per_hour": "1.2", "slug": "h200-1g"}');
INSERT INTO "audit_log" VALUES(3,'2026-12-07 00:44:26.187893','admin','profile.create','profile:h200-full',NULL,'{"cpu": 16, "description": "A whole H200 with 141 GB of HBM3e", "display_name": "Full H200", "enabled": true, "gpu": {"count": 1, "model": "H200"}, "groups": [], "idle_timeout": "30m", "images": ["pytorch", "tensorrt-llm", "cuda"], "max_runtime": "0", "memory": "128Gi", "min_run": "10m", "price_per_hour": "8", "slug": "h200-full"}');
CREATE TABLE failed_starts (
	id INTEGER NOT NULL, 
	user_name VARCHAR(255) NOT NULL, 
	server_name VARCHAR(255) NOT NULL, 
	profile VARCHAR(63) NOT NULL, 
	at DATETIME NOT NULL, 
	why TEXT NOT NULL, 
	cleared_at DATETIME, 
	cleared_by VARCHAR(255), 
	CONSTRAINT pk_failed_starts PRIMARY KEY (id)
);
CREATE TABLE identities (
	issuer VARCHAR(255) NOT NULL, 
	subject VARCHAR(255) NOT NULL, 
	user_name VARCHAR(255) NOT NULL, 
	email VARCHAR(320), 
	preferred_username VARCHAR(255), 
	created_at DATETIME NOT NULL, 
	verified_at DATETIME NOT NULL, 
	CONSTRAINT pk_identities PRIMARY KEY (issuer, subject), 
	CONSTRAINT uq_identities_user_name UNIQUE (user_name)
);
CREATE TABLE ledger_entries (
	id INTEGER NOT NULL, 
	account VARCHAR(255) NOT NULL, 
	kind VARCHAR(16) NOT NULL, 
	amount_ucr BIGINT NOT NULL, 
	note TEXT NOT NULL, 
	actor VARCHAR(255) NOT NULL, 
	user_name VARCHAR(255), 
	session_id INTEGER, 
	created_at DATETIME NOT NULL, reservation_id INTEGER, 
	CONSTRAINT pk_ledger_entries PRIMARY KEY (id), 
	CONSTRAINT uq_ledger_entries_session_id UNIQUE (session_id)
);
INSERT INTO "ledger_entries" VALUES(1,'user:ada','grant',5000000,'welcome','admin',NULL,NULL,'2026-12-07 00:44:26.179656',NULL);
CREATE TABLE limits (
	subject VARCHAR(255) NOT NULL, 
	max_gpus INTEGER, 
	max_slices INTEGER, 
	CONSTRAINT pk_limits PRIMARY KEY (subject)
);
CREATE TABLE local_accounts (
	name VARCHAR(255) NOT NULL, 
	password_hash TEXT NOT NULL, 
	created_at DATETIME NOT NULL, 
	updated_at DATETIME NOT NULL, 
	CONSTRAINT pk_local_accounts PRIMARY KEY (name)
);
CREATE TABLE meter_lease (
	id INTEGER NOT NULL, 
	holder VARCHAR(255) NOT NULL, 
	host VARCHAR(255) NOT NULL, 
	pid INTEGER NOT NULL, 
	expires_at DATETIME NOT NULL, 
	CONSTRAINT pk_meter_lease PRIMARY KEY (id)
);
CREATE TABLE notices (
	id INTEGER NOT NULL, 
	user_name VARCHAR(255) NOT NULL, 
	server_name VARCHAR(255) NOT NULL, 
	kind VARCHAR(32) NOT NULL, 
	message TEXT NOT NULL, 
	deadline DATETIME, 
	created_at DATETIME NOT NULL, 
	cleared_at DATETIME, 
	CONSTRAINT pk_notices PRIMARY KEY (id)
);
CREATE TABLE notification_prefs (
	user_name VARCHAR(255) NOT NULL, 
	channel VARCHAR(16) NOT NULL, 
	address VARCHAR(320) NOT NULL, 
	CONSTRAINT pk_notification_prefs PRIMARY KEY (user_name)
);
CREATE TABLE out_of_service (
	id INTEGER NOT NULL, 
	device_uuid VARCHAR(128) NOT NULL, 
	node VARCHAR(253) NOT NULL, 
	user_name VARCHAR(255) NOT NULL, 
	server_name VARCHAR(255) NOT NULL, 
	profile_slug VARCHAR(63) NOT NULL, 
	cgroup TEXT NOT NULL, 
	detail TEXT NOT NULL, 
	since DATETIME NOT NULL, 
	returned_at DATETIME, 
	returned_by VARCHAR(255), 
	CONSTRAINT pk_out_of_service PRIMARY KEY (id)
);
CREATE TABLE profiles (
	slug VARCHAR(63) NOT NULL, 
	spec TEXT NOT NULL, 
	enabled BOOLEAN NOT NULL, 
	created_at DATETIME NOT NULL, 
	updated_at DATETIME NOT NULL, 
	CONSTRAINT pk_profiles PRIMARY KEY (slug)
);
INSERT INTO "profiles" VALUES('cpu','{"cpu":2,"description":"No GPU. Reach your files, write code, run small jobs.","display_name":"CPU only","enabled":true,"groups":[],"idle_timeout":"30m","images":["pytorch","cuda"],"max_runtime":"0","memory":"8Gi","min_run":"10m","price_per_hour":"0.1"}',1,'2026-12-07 00:44:26.185252','2026-12-07 00:44:26.185252');
INSERT INTO "profiles" VALUES('h200-1g','{"cpu":4,"description":"One seventh of an H200, 18 GB of HBM3e","display_name":"H200 slice (1g.18gb)","enabled":true,"gpu":{"mig":"1g.18gb","model":"H200"},"groups":[],"idle_timeout":"30m","images":["pytorch","tensorrt-llm"],"max_runtime":"0","memory":"32Gi","min_run":"10m","price_per_hour":"1.2"}',1,'2026-12-07 00:44:26.186815','2026-12-07 00:44:26.186815');
INSERT INTO "profiles" VALUES('h200-full','{"cpu":16,"description":"A whole H200 with 141 GB of HBM3e","display_name":"Full H200","enabled":true,"gpu":{"count":1,"model":"H200"},"groups":[],"idle_timeout":"30m","images":["pytorch","tensorrt-llm","cuda"],"max_runtime":"0","memory":"128Gi","min_run":"10m","price_per_hour":"8"}',1,'2026-12-07 00:44:26.187768','2026-12-07 00:44:26.187768');
CREATE TABLE reservations (
	id INTEGER NOT NULL, 
	account VARCHAR(255) NOT NULL, 
	profile_slug VARCHAR(63) NOT NULL, 
	model VARCHAR(64) NOT NULL, 
	mig_profile VARCHAR(32), 
	per_unit INTEGER NOT NULL, 
	units INTEGER NOT NULL, 
	starts_at DATETIME NOT NULL, 
	ends_at DATETIME NOT NULL, 
	rate_per_hour_ucr BIGINT NOT NULL, 
	cost_ucr BIGINT NOT NULL, 
	on_end VARCHAR(16) NOT NULL, 
	note TEXT NOT NULL, 
	created_at DATETIME NOT NULL, 
	created_by VARCHAR(255) NOT NULL, 
	cancelled_at DATETIME, 
	cancelled_by VARCHAR(255), 
	end_noticed_at DATETIME, 
	CONSTRAINT pk_reservations PRIMARY KEY (id)
);
CREATE TABLE sessions (
	id INTEGER NOT NULL, 
	user_name VARCHAR(255) NOT NULL, 
	server_name VARCHAR(255) NOT NULL, 
	profile_slug VARCHAR(63) NOT NULL, 
	account VARCHAR(255) NOT NULL, 
	rate_per_hour_ucr BIGINT NOT NULL, 
	started_at DATETIME NOT NULL, 
	last_confirmed_at DATETIME NOT NULL, 
	ended_at DATETIME, 
	end_reason VARCHAR(32), 
	requested_end_reason VARCHAR(32), billed_ms BIGINT, tier VARCHAR(16) DEFAULT 'on-demand' NOT NULL, preempted_until DATETIME, preempt_why VARCHAR(500), reservation_id INTEGER, 
	CONSTRAINT pk_sessions PRIMARY KEY (id)
);
CREATE TABLE settings (
	"key" VARCHAR(128) NOT NULL, 
	value TEXT NOT NULL, 
	CONSTRAINT pk_settings PRIMARY KEY ("key")
);
CREATE TABLE spawn_queue (
	id INTEGER NOT NULL, 
	user_name VARCHAR(255) NOT NULL, 
	server_name VARCHAR(255) NOT NULL, 
	profile VARCHAR(63) NOT NULL, 
	enqueued_at DATETIME NOT NULL, 
	CONSTRAINT pk_spawn_queue PRIMARY KEY (id)
);
CREATE TABLE user_prefs (
	user_name VARCHAR(255) NOT NULL, 
	default_profile VARCHAR(63), 
	CONSTRAINT pk_user_prefs PRIMARY KEY (user_name)
);
CREATE UNIQUE INDEX uq_assignments_open_device ON assignments (device_uuid) WHERE released_at IS NULL;
CREATE INDEX ix_assignments_holder ON assignments (user_name, server_name);
CREATE INDEX ix_ledger_account_time ON ledger_entries (account, created_at);
CREATE UNIQUE INDEX uq_sessions_open_server ON sessions (user_name, server_name) WHERE ended_at IS NULL;
CREATE INDEX ix_sessions_user_started ON sessions (user_name, started_at);
CREATE INDEX ix_sessions_account_started ON sessions (account, started_at);
CREATE INDEX ix_sessions_started ON sessions (started_at);
CREATE UNIQUE INDEX uq_notices_open ON notices (user_name, server_name, kind) WHERE cleared_at IS NULL;
CREATE INDEX ix_audit_log_at ON audit_log (at);
CREATE UNIQUE INDEX uq_spawn_queue_server ON spawn_queue (user_name, server_name);
CREATE UNIQUE INDEX uq_out_of_service_open_device ON out_of_service (device_uuid) WHERE returned_at IS NULL;
CREATE INDEX ix_reservations_period ON reservations (starts_at, ends_at);
CREATE INDEX ix_failed_starts_user_profile_at ON failed_starts (user_name, profile, at);
COMMIT;
