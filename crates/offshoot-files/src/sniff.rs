//! An image's type from its first bytes, never from its name: the types Stream accepts on its
//! image endpoint.

/// The MIME types the image endpoint accepts.
pub const IMAGE_MIME_TYPES: &[&str] = &[
    "image/bmp",
    "image/gif",
    "image/jpeg",
    "image/png",
    "image/webp",
    "image/heic",
    "image/heic-sequence",
    "image/heif",
    "image/heif-sequence",
    "image/svg+xml",
];

/// The image type of a file that starts with `head` (its first 512 bytes or all of it), or
/// `None` when it is none of [`IMAGE_MIME_TYPES`].
pub fn sniff_image(head: &[u8]) -> Option<&'static str> {
    if head.starts_with(&[0xFF, 0xD8, 0xFF]) {
        return Some("image/jpeg");
    }
    if head.starts_with(b"\x89PNG\r\n\x1a\n") {
        return Some("image/png");
    }
    if head.starts_with(b"GIF87a") || head.starts_with(b"GIF89a") {
        return Some("image/gif");
    }
    if head.len() >= 12 && &head[..4] == b"RIFF" && &head[8..12] == b"WEBP" {
        return Some("image/webp");
    }
    if head.starts_with(b"BM") && head.len() >= 14 {
        return Some("image/bmp");
    }
    if head.len() >= 12 && &head[4..8] == b"ftyp" {
        return match &head[8..12] {
            b"heic" | b"heix" => Some("image/heic"),
            b"hevc" | b"hevx" => Some("image/heic-sequence"),
            b"mif1" | b"heif" => Some("image/heif"),
            b"msf1" => Some("image/heif-sequence"),
            _ => None,
        };
    }
    if looks_like_svg(head) {
        return Some("image/svg+xml");
    }
    None
}

/// Text (after an optional byte-order mark, XML declaration, comments and doctype) whose first
/// element is `<svg`.
fn looks_like_svg(head: &[u8]) -> bool {
    let text = String::from_utf8_lossy(head.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(head));
    let mut rest = text.trim_start();
    loop {
        if let Some(r) = rest.strip_prefix("<?") {
            let Some(end) = r.find("?>") else { return false };
            rest = r[end + 2..].trim_start();
        } else if let Some(r) = rest.strip_prefix("<!--") {
            let Some(end) = r.find("-->") else { return false };
            rest = r[end + 3..].trim_start();
        } else if let Some(r) = rest.strip_prefix("<!") {
            let Some(end) = r.find('>') else { return false };
            rest = r[end + 1..].trim_start();
        } else {
            return rest.starts_with("<svg");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_are_known_by_their_bytes_and_other_files_are_not_images() {
        assert_eq!(sniff_image(b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR"), Some("image/png"));
        assert_eq!(sniff_image(&[0xFF, 0xD8, 0xFF, 0xE0, 0, 0x10]), Some("image/jpeg"));
        assert_eq!(sniff_image(b"GIF89a\x01\0\x01\0"), Some("image/gif"));
        assert_eq!(sniff_image(b"RIFF\x10\0\0\0WEBPVP8 "), Some("image/webp"));
        assert_eq!(sniff_image(b"\0\0\0\x18ftypheic\0\0\0\0"), Some("image/heic"));
        assert_eq!(sniff_image(b"<?xml version=\"1.0\"?>\n<!-- x -->\n<svg xmlns=\"http://www.w3.org/2000/svg\"/>"), Some("image/svg+xml"));
        assert_eq!(sniff_image(b"%PDF-1.7\n"), None);
        assert_eq!(sniff_image(b"<html><script>alert(1)</script>"), None);
        assert_eq!(sniff_image(b"just text that is named photo.png"), None);
        assert_eq!(sniff_image(b""), None);
    }
}
