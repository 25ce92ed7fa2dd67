//! Versions: each session's history of recoverable states, in one table
//! (`checkpoints`, its name from before versions existed).
//!
//! A version names two artifacts, each possibly taken by an earlier version
//! of the same session: the files (a read-only snapshot of the session's
//! subvolume) and the processes (CRIU's images). A full version took both
//! itself; a selective one took one and pairs it with the other kind from
//! the version before (see docs/engine.md for when that pairing is valid).
//! A *checkpoint* is a version a person pinned and named: the two are one
//! concept, one row type, one lifecycle.
//!
//! Lifecycle: `pending` (queued) → `dumping` (artifacts being taken) →
//! `versioning` (manifest being written and fsynced) → `done` | `failed`,
//! and `removing` while its parts go. Only `done` is ever read by restore,
//! rollback, recover or fork, and the step to `done` is one transaction.

use rusqlite::{params, OptionalExtension};
use serde::{Deserialize, Serialize};

use crate::{any_row, sql, Cached, Catalog, CatalogError, Result, VersionState};

/// A version as the catalog stores it. Its manifest lives next to its
/// artifacts (`manifest.json`); this copy makes listing cheap.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VersionRecord {
    pub id: String,
    /// Its id unless a person named it.
    pub name: String,
    pub session_id: String,
    /// pending | dumping | versioning | done | failed | removing
    pub state: VersionState,
    pub created_at_ms: i64,
    pub manifest: serde_json::Value,
    /// Its number in its session's history (1, 2, …), given at insert;
    /// `None` for an imported checkpoint, which has no history here.
    pub number: Option<u64>,
    /// The version its session was at when this one was taken.
    pub parent: Option<String>,
    /// Kept by retention and listed as a checkpoint: `drums checkpoint`.
    pub pinned: bool,
    /// The version whose files artifact this one uses: itself when it took
    /// one. Set when it is published.
    pub files_of: Option<String>,
    /// The version whose process artifact (CRIU images) this one uses;
    /// `None` for a version without process state (the `files` policy).
    pub process_of: Option<String>,
}

const SELECT_VERSION: &str = "SELECT id, name, session_id, state, created_at_ms, manifest, \
     version, parent, pinned, files_of, process_of FROM checkpoints";

fn row_to_version(r: &rusqlite::Row<'_>) -> rusqlite::Result<(VersionRecord, String)> {
    Ok((
        VersionRecord {
            id: r.get(0)?,
            name: r.get(1)?,
            session_id: r.get(2)?,
            state: r.get(3)?,
            created_at_ms: r.get(4)?,
            manifest: serde_json::Value::Null,
            number: r.get::<_, Option<i64>>(6)?.map(|n| n as u64),
            parent: r.get(7)?,
            pinned: r.get(8)?,
            files_of: r.get(9)?,
            process_of: r.get(10)?,
        },
        r.get(5)?,
    ))
}

fn decode_version((mut rec, manifest): (VersionRecord, String)) -> Result<VersionRecord> {
    rec.manifest = serde_json::from_str(&manifest).map_err(|source| CatalogError::Decode {
        what: "manifest",
        id: rec.id.clone(),
        source,
    })?;
    Ok(rec)
}

impl Catalog {
    /// Insert a version in state `rec.state`. With `rec.number` set (any
    /// value), it gets the next number of its session's history, under the
    /// connection's lock so that two inserts never share one.
    pub fn insert_version(&self, rec: &VersionRecord) -> Result<VersionRecord> {
        let c = self.conn();
        // Under the connection's lock, so no other insert comes between the
        // check and the row; a name's own uniqueness is the table's constraint.
        let shadows = any_row(
            &c,
            "SELECT 1 FROM checkpoints WHERE (id = ?1 AND name != ?1) OR (name = ?2 AND id != ?2)",
            params![rec.name, rec.id],
            "check checkpoint name",
        )?;
        if shadows {
            return Err(CatalogError::NameIsAnId {
                what: "checkpoint",
                name: rec.name.clone(),
            });
        }
        let number: Option<i64> = match rec.number {
            None => None,
            Some(_) => Some(
                c.row_cached(
                    "SELECT COALESCE(MAX(version), 0) + 1 FROM checkpoints WHERE session_id = ?1",
                    params![rec.session_id],
                    |r| r.get(0),
                )
                .map_err(sql("number a version"))?,
            ),
        };
        let r = c.exec_cached(
            "INSERT INTO checkpoints (id, name, session_id, state, created_at_ms, manifest,
                 version, parent, pinned, files_of, process_of)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
            params![
                rec.id,
                rec.name,
                rec.session_id,
                rec.state,
                rec.created_at_ms,
                rec.manifest.to_string(),
                number,
                rec.parent,
                rec.pinned,
                rec.files_of,
                rec.process_of,
            ],
        );
        match r {
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.code == rusqlite::ErrorCode::ConstraintViolation =>
            {
                return Err(CatalogError::CheckpointNameTaken(rec.name.clone()));
            }
            r => r.map_err(sql("insert version"))?,
        };
        Ok(VersionRecord {
            number: number.map(|n| n as u64),
            ..rec.clone()
        })
    }

    /// Publish a version that is being made: its manifest, the artifacts it
    /// uses, state `done`, and the release of every ledger row of `owner`
    /// (its directory and snapshot), in one transaction. Two statements would
    /// leave a window in which a crash keeps the ledger rows of a published
    /// version, and the sweep at start-up would then delete the parts of a
    /// version users can see.
    pub fn publish_version(
        &self,
        id: &str,
        manifest: &serde_json::Value,
        files_of: &str,
        process_of: Option<&str>,
        owner: &str,
    ) -> Result<()> {
        let mut c = self.conn();
        let tx = c
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
            .map_err(sql("begin publish version"))?;
        let n = tx
            .exec_cached(
                "UPDATE checkpoints SET state = 'done', manifest = ?2, files_of = ?3, process_of = ?4
                 WHERE id = ?1 AND state IN ('pending', 'dumping', 'versioning')",
                params![id, manifest.to_string(), files_of, process_of],
            )
            .map_err(sql("publish version"))?;
        if n != 1 {
            // Dropping the transaction rolls it back: nothing is released.
            return Err(CatalogError::NotPending(id.to_owned()));
        }
        tx.exec_cached("DELETE FROM resources WHERE owner = ?1", params![owner])
            .map_err(sql("release the published version's resources"))?;
        tx.commit().map_err(sql("commit publish version"))?;
        Ok(())
    }

    pub fn set_version_state(&self, id: &str, state: VersionState) -> Result<()> {
        self.conn()
            .exec_cached(
                "UPDATE checkpoints SET state = ?2 WHERE id = ?1",
                params![id, state],
            )
            .map_err(sql("update version"))?;
        Ok(())
    }

    pub fn delete_version(&self, id: &str) -> Result<()> {
        self.conn()
            .exec_cached("DELETE FROM checkpoints WHERE id = ?1", params![id])
            .map_err(sql("delete version"))?;
        Ok(())
    }

    /// A version by id or name, in any state.
    /// Checkpoint `id` was made by a fork for its siblings: it is removed
    /// when the last session restored from it goes.
    pub fn set_with_siblings(&self, id: &str) -> Result<()> {
        self.conn()
            .exec_cached(
                "UPDATE checkpoints SET with_siblings = 1 WHERE id = ?1",
                params![id],
            )
            .map_err(sql("mark a fork's checkpoint"))?;
        Ok(())
    }

    /// Whether checkpoint `id` goes with its last sibling.
    pub fn with_siblings(&self, id: &str) -> Result<bool> {
        crate::any_row(
            &self.conn(),
            "SELECT 1 FROM checkpoints WHERE id = ?1 AND with_siblings = 1",
            params![id],
            "read a fork's checkpoint",
        )
    }

    pub fn version(&self, id_or_name: &str) -> Result<Option<VersionRecord>> {
        let c = self.conn();
        let mut st = c
            .prepare_cached(&format!("{SELECT_VERSION} WHERE id = ?1 OR name = ?1"))
            .map_err(sql("get version"))?;
        let row = st
            .query_row(params![id_or_name], row_to_version)
            .optional()
            .map_err(sql("get version"))?;
        row.map(decode_version).transpose()
    }

    /// Every version, in any state, oldest first.
    pub fn versions(&self) -> Result<Vec<VersionRecord>> {
        self.query_versions(
            &format!("{SELECT_VERSION} ORDER BY created_at_ms, id"),
            params![],
        )
    }

    /// A session's history, in any state, by number.
    pub fn session_versions(&self, session_id: &str) -> Result<Vec<VersionRecord>> {
        self.query_versions(
            &format!(
                "{SELECT_VERSION} WHERE session_id = ?1 AND version IS NOT NULL ORDER BY version"
            ),
            params![session_id],
        )
    }

    /// How many versions use `id`'s artifacts, `id` itself included: an
    /// artifact goes only when this is zero.
    pub fn artifact_users(&self, id: &str) -> Result<u64> {
        self.conn()
            .row_cached(
                "SELECT COUNT(*) FROM checkpoints WHERE files_of = ?1 OR process_of = ?1 OR id = ?1",
                params![id],
                |r| r.get::<_, i64>(0),
            )
            .map(|n| n as u64)
            .map_err(sql("count artifact users"))
    }

    fn query_versions(&self, q: &str, p: impl rusqlite::Params) -> Result<Vec<VersionRecord>> {
        let c = self.conn();
        let mut st = c.prepare_cached(q).map_err(sql("list versions"))?;
        let rows = st
            .query_map(p, row_to_version)
            .map_err(sql("list versions"))?;
        let mut out = Vec::new();
        for r in rows {
            out.push(decode_version(r.map_err(sql("list versions"))?)?);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ResourceKind;

    fn v(id: &str, session: &str) -> VersionRecord {
        VersionRecord {
            id: id.into(),
            name: id.into(),
            session_id: session.into(),
            state: VersionState::Pending,
            created_at_ms: 1,
            manifest: serde_json::json!({}),
            number: Some(0),
            parent: None,
            pinned: false,
            files_of: None,
            process_of: None,
        }
    }

    #[test]
    fn names_are_unique_and_never_an_id() {
        let c = Catalog::in_memory().unwrap();
        let mut r = VersionRecord {
            name: "warm".into(),
            pinned: true,
            ..v("c1", "s")
        };
        c.insert_version(&r).unwrap();
        r.id = "c2".into();
        assert!(
            matches!(c.insert_version(&r), Err(CatalogError::CheckpointNameTaken(n)) if n == "warm")
        );
        let shadow = VersionRecord {
            id: "c3".into(),
            name: "c1".into(),
            ..r.clone()
        };
        assert!(
            matches!(c.insert_version(&shadow), Err(CatalogError::NameIsAnId { what: "checkpoint", name }) if name == "c1")
        );
        c.publish_version(
            "c1",
            &serde_json::json!({"format_version": 1}),
            "c1",
            Some("c1"),
            "ckpt:c1",
        )
        .unwrap();
        let got = c.version("warm").unwrap().unwrap();
        assert_eq!(got.state, VersionState::Done);
        assert!(got.pinned);
        assert_eq!(got.manifest["format_version"], 1);
        c.delete_version("c1").unwrap();
        assert!(c.versions().unwrap().is_empty());
    }

    #[test]
    fn numbers_follow_each_session_and_imports_have_none() {
        let c = Catalog::in_memory().unwrap();
        assert_eq!(c.insert_version(&v("a1", "a")).unwrap().number, Some(1));
        assert_eq!(c.insert_version(&v("a2", "a")).unwrap().number, Some(2));
        assert_eq!(c.insert_version(&v("b1", "b")).unwrap().number, Some(1));
        let imported = VersionRecord {
            number: None,
            ..v("i", "a")
        };
        assert_eq!(c.insert_version(&imported).unwrap().number, None);
        let history: Vec<_> = c
            .session_versions("a")
            .unwrap()
            .into_iter()
            .map(|r| (r.id, r.number))
            .collect();
        assert_eq!(
            history,
            vec![("a1".into(), Some(1)), ("a2".into(), Some(2))],
            "the import is not in the history"
        );
    }

    /// An artifact's users are the versions that name it, itself included.
    #[test]
    fn artifacts_are_counted_by_reference() {
        let c = Catalog::in_memory().unwrap();
        c.insert_version(&v("full", "s")).unwrap();
        c.publish_version("full", &serde_json::json!({}), "full", Some("full"), "o")
            .unwrap();
        c.insert_version(&v("files", "s")).unwrap();
        c.publish_version("files", &serde_json::json!({}), "files", Some("full"), "o")
            .unwrap();
        assert_eq!(c.artifact_users("full").unwrap(), 2);
        c.delete_version("full").unwrap();
        assert_eq!(
            c.artifact_users("full").unwrap(),
            1,
            "files still uses its images"
        );
        c.delete_version("files").unwrap();
        assert_eq!(c.artifact_users("full").unwrap(), 0);
    }

    /// Publishing releases exactly the owner's ledger rows, in the same
    /// transaction; a version that is not being made is refused and releases
    /// nothing.
    #[test]
    fn publishing_releases_its_rows_atomically() {
        let c = Catalog::in_memory().unwrap();
        c.insert_version(&v("c1", "s")).unwrap();
        c.record("ckpt:c1", ResourceKind::Dir, "/state/checkpoints/c1")
            .unwrap();
        c.record("ckpt:c1", ResourceKind::Subvolume, "/store/checkpoints/c1")
            .unwrap();
        c.record("ckpt:c2", ResourceKind::Dir, "/state/checkpoints/c2")
            .unwrap();
        // Not there: refused, and no row is released.
        assert!(matches!(
            c.publish_version("nope", &serde_json::json!({}), "nope", None, "ckpt:c1"),
            Err(CatalogError::NotPending(id)) if id == "nope"
        ));
        assert_eq!(c.owned_by("ckpt:c1").unwrap().len(), 2);

        c.set_version_state("c1", VersionState::Versioning).unwrap();
        c.publish_version(
            "c1",
            &serde_json::json!({"format_version": 2}),
            "c1",
            None,
            "ckpt:c1",
        )
        .unwrap();
        let got = c.version("c1").unwrap().unwrap();
        assert_eq!(got.state, VersionState::Done);
        assert_eq!(got.files_of.as_deref(), Some("c1"));
        assert_eq!(got.process_of, None);
        assert_eq!(got.manifest["format_version"], 2);
        assert!(c.owned_by("ckpt:c1").unwrap().is_empty());
        assert_eq!(
            c.owned_by("ckpt:c2").unwrap().len(),
            1,
            "another owner's rows stay"
        );

        // Published once: a second publish is refused and touches nothing.
        c.record("ckpt:c1", ResourceKind::Dir, "/state/checkpoints/c1")
            .unwrap();
        assert!(matches!(
            c.publish_version("c1", &serde_json::json!({}), "c1", None, "ckpt:c1"),
            Err(CatalogError::NotPending(_))
        ));
        assert_eq!(c.owned_by("ckpt:c1").unwrap().len(), 1);
        assert_eq!(
            c.version("c1").unwrap().unwrap().manifest["format_version"],
            2
        );
    }
}
