"""The Gemini wire format: generateContent, Files, batchGenerateContent."""
