//! The integration tests: one scenario per module, each a file of this directory, all of them in
//! one test binary. Linking aya and the rest once instead of once per scenario is most of what
//! building the tests costs.
//!
//! The scenarios share this process and run on libtest's threads, so none of them may change
//! what is the process's own (resource limits, signal dispositions, the working directory, the
//! environment, its credentials or namespaces): what a scenario needs changed, it changes in
//! the processes it starts.
//!
//! One scenario: `cargo test -p leash-tests --test scenarios -- fork_chain::` (a filter is a
//! substring of `module::test`: `threads::` matches `kill_threads::` too). A new file here must
//! be declared below; xtask's tests fail when one is not.

mod acp_examples;
mod adopt_existing;
mod adopt_steps;
mod agent_dies;
mod agent_rights;
mod capabilities;
mod cli_track;
mod cli_words;
mod daemon_memory;
mod daemon_restart;
mod daemon_shutdown;
mod daemon_start_errors;
mod deploy_manifests;
mod doc_examples;
mod doctor;
mod doomed_fork;
mod doomed_newborn;
mod double_fork;
mod exec_chain;
mod exec_shim;
mod fail_closed;
mod fd_disposal;
mod fd_exhaustion;
mod flood;
mod forged_sender;
mod fork_chain;
mod garbage;
mod grace_shortened;
mod hijacked_dirs;
mod host_death;
mod host_dies;
mod host_killed_mid_wait;
mod host_memory;
mod host_node;
mod host_packages;
mod host_python;
mod host_words;
mod hostile_storm;
mod json_outputs;
mod kill_grace;
mod kill_nested;
mod kill_releases;
mod kill_setsid_storm;
mod kill_steps;
mod kill_threads;
mod lease_sender;
mod log_fields;
mod log_volume;
mod map_full;
mod member_quota;
mod membership;
mod metrics;
mod parked_flood;
mod pid_namespace;
mod pid_recycle;
mod pidfd_register;
mod pin_lock;
mod pinned_tracker;
mod policies;
mod process_identity;
mod ptrace_guard;
mod quiet_output;
mod root_exit;
mod run_refused;
mod run_status;
mod secret_token;
mod setsid_chain;
mod setsid_storm_daemon;
mod shared_view;
mod slow_viewer;
mod subordinate_uids;
mod subreaper;
mod systemd_unit;
mod tenancy;
mod thousand;
mod thread_exits;
mod threads;
mod tiocsti;
mod token_limits;
mod unprivileged;
mod untracked_storm;
mod userns_flood;
mod version;
mod watch_tmux;
mod whois;
