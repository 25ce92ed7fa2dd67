//! OCI images (docs/oci.md): the layers stored in the btrfs store, keyed by
//! chain id, and the images and names that use them.
//!
//! A layer's subvolume comes before its row, and an image's row (with its
//! names) comes last, in one transaction: a pull or import cut short is
//! never an image, and what it left is a subvolume or a layer row that no
//! image uses, which the sweep at start removes.

use rusqlite::{params, OptionalExtension};

use crate::{sql, Cached, Catalog, Result};

pub(crate) const MIGRATE_7: &str = "BEGIN;
     CREATE TABLE oci_layers (
         chain_id TEXT PRIMARY KEY,
         diff_id TEXT NOT NULL,
         parent TEXT,
         size INTEGER NOT NULL,
         created_at_ms INTEGER NOT NULL
     );
     CREATE TABLE oci_images (
         id TEXT PRIMARY KEY,
         manifest_digest TEXT NOT NULL,
         layers TEXT NOT NULL,
         config TEXT NOT NULL,
         created_at_ms INTEGER NOT NULL
     );
     CREATE TABLE oci_names (
         name TEXT PRIMARY KEY,
         image_id TEXT NOT NULL REFERENCES oci_images (id)
     );
     CREATE INDEX oci_names_image ON oci_names (image_id);
     PRAGMA user_version = 7;
     COMMIT;";

/// A stored layer: its subvolume holds it and every layer below it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerRow {
    /// `sha256:HEX` over the diff-ids from the base up to this one.
    pub chain_id: String,
    pub diff_id: String,
    pub parent: Option<String>,
    /// Bytes of file content this layer's tar wrote.
    pub size: u64,
}

/// A stored image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRow {
    /// `sha256:HEX` of its config: the image id.
    pub id: String,
    pub manifest_digest: String,
    /// Chain ids, base first.
    pub layers: Vec<String>,
    /// The config as it came, digest-checked.
    pub config: String,
    pub created_at_ms: i64,
    /// The references that name it, sorted.
    pub names: Vec<String>,
}

impl Catalog {
    /// Records a layer whose subvolume is in place (a layer already
    /// recorded is fine: two pulls may share it).
    pub fn insert_layer(&self, l: &LayerRow) -> Result<()> {
        self.conn()
            .exec_cached(
                "INSERT INTO oci_layers (chain_id, diff_id, parent, size, created_at_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (chain_id) DO NOTHING",
                params![
                    l.chain_id,
                    l.diff_id,
                    l.parent,
                    l.size as i64,
                    crate::now_ms()
                ],
            )
            .map_err(sql("record a layer"))?;
        Ok(())
    }

    pub fn layer(&self, chain_id: &str) -> Result<Option<LayerRow>> {
        self.conn()
            .row_cached(
                "SELECT chain_id, diff_id, parent, size FROM oci_layers WHERE chain_id = ?1",
                params![chain_id],
                |r| {
                    Ok(LayerRow {
                        chain_id: r.get(0)?,
                        diff_id: r.get(1)?,
                        parent: r.get(2)?,
                        size: r.get::<_, i64>(3)? as u64,
                    })
                },
            )
            .optional()
            .map_err(sql("read a layer"))
    }

    /// Every recorded layer.
    pub fn layers(&self) -> Result<Vec<LayerRow>> {
        let c = self.conn();
        let mut st = c
            .prepare_cached(
                "SELECT chain_id, diff_id, parent, size FROM oci_layers ORDER BY chain_id",
            )
            .map_err(sql("list layers"))?;
        let rows = st
            .query_map([], |r| {
                Ok(LayerRow {
                    chain_id: r.get(0)?,
                    diff_id: r.get(1)?,
                    parent: r.get(2)?,
                    size: r.get::<_, i64>(3)? as u64,
                })
            })
            .map_err(sql("list layers"))?
            .collect::<rusqlite::Result<Vec<_>>>()
            .map_err(sql("list layers"))?;
        Ok(rows)
    }

    /// Removes a layer's row (its subvolume is already gone).
    pub fn delete_layer(&self, chain_id: &str) -> Result<()> {
        self.conn()
            .exec_cached(
                "DELETE FROM oci_layers WHERE chain_id = ?1",
                params![chain_id],
            )
            .map_err(sql("remove a layer"))?;
        Ok(())
    }

    /// Makes the image visible, with `name` (if any) moved onto it, in one
    /// transaction: this is the step that makes a pull or import happen.
    /// Its layers must be recorded already.
    pub fn commit_image(&self, img: &ImageRow, name: Option<&str>) -> Result<()> {
        let mut c = self.conn();
        let tx = c.transaction().map_err(sql("begin an image commit"))?;
        let layers = serde_json::to_string(&img.layers).expect("strings serialize");
        tx.exec_cached(
            "INSERT INTO oci_images (id, manifest_digest, layers, config, created_at_ms)
             VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (id) DO NOTHING",
            params![
                img.id,
                img.manifest_digest,
                layers,
                img.config,
                img.created_at_ms
            ],
        )
        .map_err(sql("record an image"))?;
        if let Some(name) = name {
            tx.exec_cached(
                "INSERT INTO oci_names (name, image_id) VALUES (?1, ?2)
                 ON CONFLICT (name) DO UPDATE SET image_id = ?2",
                params![name, img.id],
            )
            .map_err(sql("name an image"))?;
        }
        tx.commit().map_err(sql("commit an image"))?;
        Ok(())
    }

    /// Name image `id` `name` (a reference as stored), moving the name off
    /// any image that had it, as `podman tag` does.
    pub fn tag_image(&self, name: &str, id: &str) -> Result<()> {
        self.conn()
            .exec_cached(
                "INSERT INTO oci_names (name, image_id) VALUES (?1, ?2)
                 ON CONFLICT (name) DO UPDATE SET image_id = ?2",
                params![name, id],
            )
            .map_err(sql("tag an image"))?;
        Ok(())
    }

    /// Every image, newest first.
    pub fn images(&self) -> Result<Vec<ImageRow>> {
        let ids: Vec<String> = {
            let c = self.conn();
            let mut st = c
                .prepare_cached("SELECT id FROM oci_images ORDER BY created_at_ms DESC, id")
                .map_err(sql("list images"))?;
            let rows = st
                .query_map([], |r| r.get(0))
                .map_err(sql("list images"))?
                .collect::<rusqlite::Result<Vec<_>>>()
                .map_err(sql("list images"))?;
            rows
        };
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            if let Some(i) = self.image(&id)? {
                out.push(i);
            }
        }
        Ok(out)
    }

    /// The image with id `id`.
    pub fn image(&self, id: &str) -> Result<Option<ImageRow>> {
        let c = self.conn();
        let row = c
            .row_cached(
                "SELECT id, manifest_digest, layers, config, created_at_ms
                 FROM oci_images WHERE id = ?1",
                params![id],
                |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, String>(1)?,
                        r.get::<_, String>(2)?,
                        r.get::<_, String>(3)?,
                        r.get::<_, i64>(4)?,
                    ))
                },
            )
            .optional()
            .map_err(sql("read an image"))?;
        let Some((id, manifest_digest, layers, config, created_at_ms)) = row else {
            return Ok(None);
        };
        let layers =
            serde_json::from_str(&layers).map_err(|source| crate::CatalogError::Decode {
                what: "image layers",
                id: id.clone(),
                source,
            })?;
        let mut st = c
            .prepare_cached("SELECT name FROM oci_names WHERE image_id = ?1 ORDER BY name")
            .map_err(sql("read an image's names"))?;
        let names = st
            .query_map(params![id], |r| r.get(0))
            .map_err(sql("read an image's names"))?
            .collect::<rusqlite::Result<Vec<String>>>()
            .map_err(sql("read an image's names"))?;
        Ok(Some(ImageRow {
            id,
            manifest_digest,
            layers,
            config,
            created_at_ms,
            names,
        }))
    }

    /// The id of the image named `name`.
    pub fn image_named(&self, name: &str) -> Result<Option<String>> {
        self.conn()
            .row_cached(
                "SELECT image_id FROM oci_names WHERE name = ?1",
                params![name],
                |r| r.get(0),
            )
            .optional()
            .map_err(sql("look up an image name"))
    }

    /// Ids of images starting with `prefix` (a short id, as `ps` shows).
    pub fn images_with_prefix(&self, prefix: &str) -> Result<Vec<String>> {
        let c = self.conn();
        let mut st = c
            .prepare_cached("SELECT id FROM oci_images WHERE substr(id, 1, length(?1)) = ?1")
            .map_err(sql("look up an image id"))?;
        let rows = st
            .query_map(params![prefix], |r| r.get(0))
            .map_err(sql("look up an image id"))?
            .collect::<rusqlite::Result<Vec<_>>>()
            .map_err(sql("look up an image id"))?;
        Ok(rows)
    }

    /// What still uses image `id`: sessions by name, and checkpoints by
    /// name (a checkpoint restores onto its session's image).
    pub fn image_users(&self, id: &str) -> Result<Vec<String>> {
        let c = self.conn();
        let mut users = Vec::new();
        let mut st = c
            .prepare_cached("SELECT name FROM sessions WHERE image = ?1 ORDER BY name")
            .map_err(sql("list an image's sessions"))?;
        for r in st
            .query_map(params![id], |r| r.get::<_, String>(0))
            .map_err(sql("list an image's sessions"))?
        {
            users.push(format!(
                "session {}",
                r.map_err(sql("list an image's sessions"))?
            ));
        }
        let mut st = c
            .prepare_cached(
                "SELECT name FROM checkpoints
                 WHERE json_extract(manifest, '$.session.image') = ?1 ORDER BY name",
            )
            .map_err(sql("list an image's checkpoints"))?;
        for r in st
            .query_map(params![id], |r| r.get::<_, String>(0))
            .map_err(sql("list an image's checkpoints"))?
        {
            users.push(format!(
                "checkpoint {}",
                r.map_err(sql("list an image's checkpoints"))?
            ));
        }
        Ok(users)
    }

    /// Removes image `id` and its names. The caller checked
    /// [`Catalog::image_users`] under the images lock.
    pub fn delete_image(&self, id: &str) -> Result<()> {
        let mut c = self.conn();
        let tx = c.transaction().map_err(sql("begin an image removal"))?;
        tx.exec_cached("DELETE FROM oci_names WHERE image_id = ?1", params![id])
            .map_err(sql("unname an image"))?;
        tx.exec_cached("DELETE FROM oci_images WHERE id = ?1", params![id])
            .map_err(sql("remove an image"))?;
        tx.commit().map_err(sql("commit an image removal"))?;
        Ok(())
    }

    /// Removes one name; the image stays.
    pub fn untag_image(&self, name: &str) -> Result<bool> {
        let n = self
            .conn()
            .exec_cached("DELETE FROM oci_names WHERE name = ?1", params![name])
            .map_err(sql("unname an image"))?;
        Ok(n > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(chain: &str, parent: Option<&str>) -> LayerRow {
        LayerRow {
            chain_id: chain.into(),
            diff_id: format!("d{chain}"),
            parent: parent.map(Into::into),
            size: 10,
        }
    }

    #[test]
    fn an_image_commits_with_its_name_and_moves_a_name() {
        let dir = tempfile::tempdir().unwrap();
        let c = Catalog::open(&dir.path().join("c.db")).unwrap();
        c.insert_layer(&layer("a", None)).unwrap();
        c.insert_layer(&layer("a", None)).unwrap();
        c.insert_layer(&layer("b", Some("a"))).unwrap();
        assert_eq!(c.layers().unwrap().len(), 2);
        let img = |id: &str, layers: &[&str]| ImageRow {
            id: id.into(),
            manifest_digest: format!("m{id}"),
            layers: layers.iter().map(|s| s.to_string()).collect(),
            config: "{}".into(),
            created_at_ms: 1,
            names: vec![],
        };
        c.commit_image(&img("sha256:1", &["a"]), Some("r/x:1"))
            .unwrap();
        c.commit_image(&img("sha256:2", &["a", "b"]), Some("r/x:1"))
            .unwrap();
        assert_eq!(c.image_named("r/x:1").unwrap().as_deref(), Some("sha256:2"));
        let one = c.image("sha256:1").unwrap().unwrap();
        assert!(one.names.is_empty());
        let two = c.image("sha256:2").unwrap().unwrap();
        assert_eq!((two.layers.len(), two.names.len()), (2, 1));
        assert_eq!(c.images_with_prefix("sha256:").unwrap().len(), 2);
        assert!(c.image_users("sha256:2").unwrap().is_empty());
        c.delete_image("sha256:2").unwrap();
        assert_eq!(c.image_named("r/x:1").unwrap(), None);
        assert_eq!(c.images().unwrap().len(), 1);
    }
}
